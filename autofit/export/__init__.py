"""The answer written down: derived once (``Answer``), rendered as ``best.yaml`` for ``trl <algo> --config``,
``best.json`` (the same, structured, with what was measured) and the terminal's summary; the engine files beside them,
and the terminal's table of probes."""

from autofit.export._answer import Answer, answer
from autofit.export._files import FILES, OUTPUTS, TERMINAL, Output, write
from autofit.export._json import json_data
from autofit.export._table import summary_lines, table_text
from autofit.export._words import trades
from autofit.export._write import yaml_text

__all__ = ["FILES", "OUTPUTS", "TERMINAL", "Answer", "Output", "answer", "json_data", "summary_lines", "table_text",
           "trades", "write", "yaml_text"]
