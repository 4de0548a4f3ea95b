"""``report.html``: a search's answer, its probes and the memory model's view of them on one self-contained page,
drawn from ``best.json`` and the study (``autofit report DIR`` draws it again); the figures ``autofit estimate
--plot`` saves."""

from autofit.report._data import ReportData, gather
from autofit.report._html import REPORT_FILE, write
from autofit.report._plots import PLOT_SUFFIXES, ledger_figure, save

__all__ = ["PLOT_SUFFIXES", "REPORT_FILE", "ReportData", "gather", "ledger_figure", "save", "write"]
