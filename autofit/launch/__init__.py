"""The user's launch, read once at the door: the TRL config file as ``trl <algo> --config`` reads it (with the
launch's own flags), the accelerate config (``--accelerate-config``, the file's ``accelerate_config``, ``accelerate
launch --config_file``) and its DeepSpeed JSON, the command after ``--`` (``trl ...``, ``accelerate launch ... trl
...``), and the engine they run. ``read_launch`` returns a ``Launch`` (``autofit.core``) that travels on the search's
spec; what it means for the search (the options it sets, the baseline, the notes) is read from that value, never
from the files again. The search's process never imports torch: TRL's parser runs in a process of its own.
"""

from autofit.launch._accelerate_file import read_accelerate_config, read_deepspeed_json, trl_names, zero_settings
from autofit.launch._command import ACCEPTED, COMMANDS, read_command, split_launch, trl_command_names
from autofit.launch._config_file import read_config_text
from autofit.launch._door import at_door, read_launch, with_launch
from autofit.launch._engine import launch_engine
from autofit.launch._run import (
    MAPPED,
    NOT_PROBED,
    baseline,
    option_values,
    passed_through,
    probe_notes,
    probed_as_written,
    unmodelled,
    unmodelled_note,
)
from autofit.launch._trl_file import READABLE_ALGOS, read_trl_file

__all__ = [
    "ACCEPTED", "COMMANDS", "MAPPED", "NOT_PROBED", "READABLE_ALGOS", "at_door", "baseline", "launch_engine",
    "option_values", "passed_through", "probe_notes", "probed_as_written", "read_accelerate_config", "read_command",
    "read_config_text",
    "read_deepspeed_json", "read_launch", "read_trl_file", "split_launch", "trl_command_names", "trl_names",
    "unmodelled", "unmodelled_note", "with_launch", "zero_settings",
]
