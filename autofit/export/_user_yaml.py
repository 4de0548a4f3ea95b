"""best.yaml from the user's own TRL config file (``--config``): their file, its comments and order kept, with every
key the search changed set to its new value and a comment that says what it was and why, and every key it added
marked the same way. Keys the search did not change keep the user's text exactly (``3.0e-5`` stays ``3.0e-5``).

Values are compared with what TRL parsed from the file (PyYAML, YAML 1.1: ``yes`` is true), and ruamel.yaml only
edits the text. best.json's ``changes`` lists the same edits.
"""

from __future__ import annotations

import io
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import YAMLError
from ruamel.yaml.representer import RoundTripRepresenter
from ruamel.yaml.util import load_yaml_guess_indent

from autofit.core import TRL_KEYS, Candidate, TrlFile, keys_of
from autofit.machine import resolve_model
from autofit.rungs import rung_named

# How the probes ran on a GPU machine: the user's file is kept. A CPU search writes what its probes ran with
# (`use_cpu: true`, `bf16: false`, as the --model path does): TRL refuses bf16 on a machine without a GPU.
KEPT_AS_WRITTEN = ("use_cpu", "bf16")
MODEL_KEY = "model_name_or_path"
# What the probes set to run their machine (a CPU search trains on the simulated device): exported only where the
# user's value would not run the answer there.
CHECKPOINTING = keys_of("checkpointing")
# The keys that run the user's own engine: taken out where a rung's engine replaced it (``Candidate.replaces``), since
# TRL would run them over the accelerate.yaml best.yaml is launched with (its file's accelerate_config comes first)
ENGINE_KEYS = keys_of("engine") + ("accelerate_config",)


def _float(representer: RoundTripRepresenter, value: float) -> Any:
    """Floats PyYAML reads back as floats: ``2e-05`` (a string to YAML 1.1) is written ``2.0e-5``."""
    text = repr(value)
    if "e" in text and "." not in text.split("e")[0]:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}.0e{int(exponent)}"
    return representer.represent_scalar("tag:yaml.org,2002:float", text)


def _yaml(text: str = "") -> YAML:
    """A round-trip YAML that writes block mappings and sequences indented as ``text`` indents them."""
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.representer.add_representer(float, _float)
    mapping, sequence, offset = _indents(text)
    yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
    return yaml


def _indents(text: str) -> Tuple[int, int, int]:
    """(mapping indent, sequence indent, dash offset) of the file: ``  - q_proj`` under its key is (2, 4, 2), ruamel's
    own default ``- q_proj`` (2, 2, 0). The first nested mapping and the first block sequence decide."""
    mapping = 2
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for line, following in zip(lines, lines[1:], strict=False):
        parent = len(line) - len(line.lstrip())
        child = len(following) - len(following.lstrip())
        if re.match(r"\s*[^\s#-][^#]*:\s*(#.*)?$", line) and child > parent and not following.lstrip().startswith("-"):
            mapping = child - parent
            break
    try:
        _, sequence, offset = load_yaml_guess_indent(text) if text else (None, None, None)
    except YAMLError:  # the file was read by TRL already; a guess that fails keeps ruamel's default
        sequence, offset = None, None
    if sequence is None or offset is None:
        return mapping, mapping, 0
    return mapping, max(sequence, offset + 2), offset


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _set(mapping: CommentedMap, key: str, value: Any, note: str) -> None:
    """Set ``key`` with an end-of-line comment, keeping the user's own comment on that line and what followed it (a
    blank line, the next section's heading)."""
    token = mapping.ca.items.get(key, [None, None, None, None])[2]
    old = token.value if token is not None else ""
    first, _, rest = old.partition("\n")
    first = first.strip().lstrip("#").strip()
    if key in mapping:
        mapping[key] = value
    else:
        mapping.insert(len(mapping), key, value)
    mapping.yaml_add_eol_comment(f"{note}; yours: {first}" if first else note, key)
    if rest:
        mapping.ca.items[key][2].value = mapping.ca.items[key][2].value.rstrip("\n") + "\n" + rest


def _checkpointing_key(user: TrlFile, exported: Dict[str, Any]) -> Dict[str, Any]:
    """The checkpointing switch under the name the user's file uses (either name works; the file's stays)."""
    found = [key for key in CHECKPOINTING if key in exported]
    written = [key for key in CHECKPOINTING if user.wrote(key)]
    if found and written and found[0] != written[0]:
        exported = dict(exported)
        exported[written[0]] = exported.pop(found[0])
    return exported


def user_yaml(user: TrlFile, candidate: Candidate, exported: Dict[str, Any], why: Callable[[str], str],
              header: List[str]) -> Tuple[str, List[Dict[str, Any]]]:
    """The user's file with what the answer changes (``exported``: every training and model argument the answer
    sets, by TRL's names; ``why``: the comment on a key, ``env.NAME`` for an environment variable); returns the text
    and the list of changes."""
    yaml = _yaml(user.text)
    document = yaml.load(user.text)
    changes: List[Dict[str, Any]] = []
    exported = _checkpointing_key(user, exported)
    if not user.wrote(TRL_KEYS.init_kwargs) and exported.get(TRL_KEYS.init_kwargs) == {"dtype": exported.get("dtype")}:
        exported = {k: v for k, v in exported.items() if k != TRL_KEYS.init_kwargs}  # TRL's script passes dtype on
    for key, value in exported.items():
        if key == MODEL_KEY:
            _model(document, user, candidate, value, changes)
            continue
        if key in KEPT_AS_WRITTEN and candidate.device != "cpu":
            continue
        parsed = user.training.get(key, user.model.get(key))
        if key in KEPT_AS_WRITTEN:  # TRL parsed the file with --use_cpu: what the file itself says
            parsed = user.written.get(key)
        if _plain(value) == parsed or key == "attn_implementation":
            continue  # the user's attention as written (or TRL's default, which the probes ran), never replaced
        reason = why(key)
        written = user.wrote(key)
        default = f"TRL default {_show(parsed)}" if key in user.training or key in user.model else "new"
        note = f"autofit: was {_show(parsed)}; {reason}" if written else f"autofit: added ({default}); {reason}"
        _set(document, key, _plain(value), note)
        changes.append({"key": key, "was": parsed, "now": _plain(value), "why": reason, "added": not written})
    if candidate.env:
        env = document.get("env")
        if not isinstance(env, dict):
            env = CommentedMap()
            document["env"] = env
        for key, value in candidate.env:
            if env.get(key) is None or str(env.get(key)) != value:  # TRL sets str(value): `1` is "1", as written
                was, reason = env.get(key), why(f"env.{key}")
                _set(env, key, value, f"autofit: {'was ' + _show(was) if was is not None else 'added'}; {reason}")
                changes.append({"key": f"env.{key}", "was": was, "now": value, "why": reason, "added": was is None})
    header = header + _engine_removed(document, user, candidate, changes)
    out = io.StringIO()
    yaml.dump(document, out)
    return "\n".join(header) + "\n" + out.getvalue(), changes


def _engine_removed(document: CommentedMap, user: TrlFile, candidate: Candidate,
                    changes: List[Dict[str, Any]]) -> List[str]:
    """Where the answer runs an engine of autofit's instead of the launch's own: the file's engine keys taken out,
    each a change, and the header's line that says so."""
    removed = [key for key in ENGINE_KEYS if candidate.replaces and key in document]
    if not removed:
        return []
    rung = next((name for name in reversed(candidate.rungs) if getattr(rung_named(name), "runs_an_engine", False)),
                candidate.engine)
    reason = (f"your launch's {candidate.replaces} replaced by the {rung} rung's engine ({candidate.engine}): "
              "run with the accelerate.yaml autofit writes")
    for key in removed:
        changes.append({"key": key, "was": user.written.get(key), "now": None, "why": reason, "added": False,
                        "removed": True})
        del document[key]
    return [f"# autofit: removed {', '.join(f'{key}:' for key in removed)}; {reason}, not your own"]


def _model(document: CommentedMap, user: TrlFile, candidate: Candidate, loadable: str,
           changes: List[Dict[str, Any]]) -> None:
    """The model that was measured, under a name TRL loads: the file's own when it is that model and loads as written;
    a bundled model's checkpoint (it has no hub id); ``--model``'s, said, where it replaced the file's."""
    written = user.written.get(MODEL_KEY)
    if written == loadable:
        return
    if written == candidate.model:
        if "/" in candidate.model or resolve_model(candidate.model).local_path:
            return  # a hub id or a folder, as the user wrote it (export's loadable_name keeps them too)
        reason = (f"{candidate.model} is bundled with autofit and has no hub id: its trainable checkpoint (random "
                  "weights), which TRL loads")
    else:
        reason = f"the model measured (--model {candidate.model}), not the file's"
    note = f"autofit: was {_show(written)}; {reason}" if written is not None else f"autofit: added; {reason}"
    _set(document, MODEL_KEY, loadable, note)
    changes.append({"key": MODEL_KEY, "was": written, "now": loadable, "why": reason, "added": written is None})


def _show(value: Optional[Any]) -> str:
    return "unset" if value is None else str(value)
