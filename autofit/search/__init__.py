"""The controller: walk the ladder over probes, find the largest micro-batch (or the longest sequence) that fits at
each level, choose among the fits and verify the choice. It runs in the user's process and never imports torch:
probes measure, the memory model predicts, and an Optuna study on disk keeps every probe so a search resumes.

``question`` turns the options of a search into the question resolved on this machine (``estimate_question``: for a
GPU it need not have); ``Search`` answers it with a ``Runner`` (``SlotRunner``: probes side by side on the devices
``probe_slots`` gives); ``SearchReport`` is what it found (every probe a ``Record``).
"""

from autofit.memory_model import divisors, length_grid  # the search's grids, shared with estimate
from autofit.search._faults import FaultWatch, InfrastructureError, check_no_fit_is_an_answer
from autofit.search._hints import no_fit_hints
from autofit.search._host_memory import available_host_bytes
from autofit.search._machine_rates import host_card
from autofit.search._margin import over_margin
from autofit.search._question import check_model_code, check_model_sizes, estimate_question, question
from autofit.search._result import Fit, Record, SearchReport, Skip, undominated
from autofit.search._search import Search
from autofit.search._slots import SlotRunner, probe_slots, slot_runner
from autofit.search._store import STUDY_FILE, ProbeStore, quiet_optuna

__all__ = [
    "STUDY_FILE", "FaultWatch", "Fit", "InfrastructureError", "ProbeStore", "Record", "Search", "SearchReport",
    "Skip", "SlotRunner", "available_host_bytes", "check_model_code", "check_model_sizes", "check_no_fit_is_an_answer",
    "divisors", "estimate_question", "host_card", "length_grid", "no_fit_hints", "over_margin", "probe_slots",
    "question", "quiet_optuna", "slot_runner", "undominated",
]
