"""The launch's own ``--field value`` flags after its config file (``trl sft --config sft.yaml --learning_rate 1e-4``),
folded into the file as TRL reads them: TRL's parser reads the flags over the file (``autofit.probe._trl_config``
runs it with them), and the fields they set become keys of the file's text, with the values TRL parsed. So every later
stage (the options, the baseline, the probes' training arguments, best.yaml) sees one run, the launch's: best.yaml is
your file with your launch's flags written in, and the changes fitting needed.
"""

from __future__ import annotations

import io
from typing import Any, Dict, List, Sequence, Tuple

from autofit.core import InputError, one_line


def flagged_names(args: Sequence[str]) -> List[str]:
    """The field names the launch's flags give (``--per-device-train-batch-size`` is ``per_device_train_batch_size``),
    in order; after a ``--``, accelerate launch's own options, never TRL's fields."""
    names: List[str] = []
    for word in args:
        if word == "--":
            break
        if word.startswith("--") and len(word) > 2:
            name = word[2:].split("=", 1)[0].replace("-", "_")
            if name not in names:
                names.append(name)
    return names


def fold_flags(text: str, path: str, args: Sequence[str],
               fields: Dict[str, Dict[str, Any]]) -> Tuple[str, Dict[str, Any]]:
    """(the file's text with the flagged fields set, {field: value as TRL parsed it}); ``fields``: TRL's parse of the
    file and the flags, by dataclass. Flags no dataclass has (accelerate's: ``--num_processes``) are the launch's."""
    values: Dict[str, Any] = {}
    for name in flagged_names(args):
        for group in ("training", "model", "script", "datasets"):
            if name in fields.get(group, {}):
                values[name] = fields[group][name]
                break
    if not values:
        return text, {}
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    try:
        document = yaml.load(text)
    except YAMLError as exc:  # the door read it already; ruamel.yaml writes best.yaml back from it
        raise InputError(f"--config {path}: cannot be read with your launch's flags ({one_line(exc)})") from None
    for name, value in values.items():
        document[name] = value
    out = io.StringIO()
    yaml.dump(document, out)
    return out.getvalue(), values
