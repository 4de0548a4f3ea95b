"""Issue 45, item 1: a knob's TRL keys are spelled in the knob table only (autofit/core/_knob*.py); every other module
reads them from there (``keys_of``, the table's named keys). A literal elsewhere is a second declaration that drifts.
The exceptions below are the same word in another vocabulary, each with its reason."""

import re
from pathlib import Path

from autofit.core._knob_table import KNOBS

PACKAGE = Path(__file__).resolve().parents[2] / "autofit"
# Knob keys that are also the names of options, candidate fields or config.json entries: a literal of them is not
# the TRL key (``--dtype``, ``Candidate.optim``, config.json's ``dtype``)
SHARED_WORDS = {"dtype", "env", "optim", "max_length", "max_completion_length", "beta", "num_generations",
                "deepspeed", "fsdp", "fsdp_config", "trust_remote_code", "attn_implementation", "vllm_max_model_length"}
OTHER_VOCABULARIES = {
    "launch/_accelerate_keys.py": {"gradient_accumulation_steps"},  # accelerate's DeepSpeed plugin key
    "rungs/engines/_files.py": {"gradient_accumulation_steps"},  # DeepSpeed's JSON key
    "launch/_engine.py": {"activation_checkpointing"},  # fsdp_config's own key (FSDP's checkpointing)
    "core/_compat.py": {"activation_checkpointing", "gradient_checkpointing"},  # the field's name by version
    "core/_options.py": {"use_vllm"},  # the option --use-vllm
    "launch/_trl_values.py": {"use_vllm"},  # the option --use-vllm, as the door's values and the file's options name it
    "core/_settings.py": {"use_rslora"},  # LoraSettings' field
    "search/_guide.py": {"lora_alpha"},  # peft's LoraConfig field, read back from a built trainer
}


def test_no_module_spells_a_knobs_key_outside_the_table():
    keys = {key for knob in KNOBS for key in knob.keys} - SHARED_WORDS
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        if path.name.startswith("_knob"):
            continue
        text = path.read_text()
        spelled = {key for key in keys if re.search("[\"']" + re.escape(key) + "[\"']", text)}
        spelled -= OTHER_VOCABULARIES.get(name, set())
        if spelled:
            found[name] = sorted(spelled)
    assert not found, found
