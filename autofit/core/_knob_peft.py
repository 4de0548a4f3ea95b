"""The knobs of ModelConfig's adapters and quantized base (``autofit.core._knob_table`` lists them with the rest):
LoRA in TRL's ModelConfig keys, in peft's ``LoraConfig`` (best.json's block, ``Candidate.peft_config``) and as a
built trainer's peft config reads back; the 4/8-bit base in ModelConfig's keys, in transformers' ``BitsAndBytesConfig``
and as the built model's quantization config reads back."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from autofit.core._candidate_fields import CandidateFields
from autofit.core._knob import FileRun, Knob
from autofit.core._settings import LORA_TARGETS, LoraSettings, QuantSettings

BNB_KEYS = ("bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage")  # ModelConfig's 4-bit keys


def _lora_model(candidate: CandidateFields, observed: Mapping[str, Any]) -> Dict[str, Any]:
    lora = candidate.lora
    if lora is None:
        return {}
    args: Dict[str, Any] = dict(use_peft=True, lora_r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                lora_target_modules=targets(lora.target_modules))
    if lora.modules_to_save:
        args["lora_modules_to_save"] = list(lora.modules_to_save)
    if lora.use_rslora:
        args["use_rslora"] = True
    return args


def _peft_block(candidate: CandidateFields) -> Optional[Dict[str, Any]]:
    """peft's ``LoraConfig`` arguments (best.json's ``peft``; ``Candidate.peft_config`` builds it from them)."""
    lora = candidate.lora
    if lora is None:
        return None
    peft: Dict[str, Any] = {"type": "lora", "r": lora.r, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
                            "target_modules": targets(lora.target_modules)}
    if lora.modules_to_save:  # the file's lora_modules_to_save, trained whole
        peft["modules_to_save"] = list(lora.modules_to_save)
    if lora.use_rslora:
        peft["use_rslora"] = True
    return peft


def _lora_of(run: FileRun) -> Dict[str, Any]:
    model = run.model
    if not model.get("use_peft"):
        return {"lora": None}
    found = model.get("lora_target_modules")
    saved = model.get("lora_modules_to_save")
    return {"lora": LoraSettings(
        r=int(model.get("lora_r") or 16), alpha=int(model.get("lora_alpha") or 32),
        dropout=float(model.get("lora_dropout") or 0.0),
        target_modules=tuple(found) if isinstance(found, list) else (found or LORA_TARGETS),
        modules_to_save=tuple(saved) if isinstance(saved, list) else ((saved,) if saved else ()),
        use_rslora=bool(model.get("use_rslora")))}


def _peft_of(trainer: Any) -> Dict[str, Any]:
    """The trainer model's LoRA adapter, in peft's terms (target modules by their short names)."""
    configs = getattr(trainer.model, "peft_config", None)
    if not isinstance(configs, dict) or not configs:
        return {"peft": None}
    config = next(iter(configs.values()))
    found = getattr(config, "target_modules", None)
    if isinstance(found, (set, list, tuple)):
        found = sorted({str(name).rsplit(".", 1)[-1] for name in found})
    saved = getattr(config, "modules_to_save", None)
    return {"peft": {"r": getattr(config, "r", None), "lora_alpha": getattr(config, "lora_alpha", None),
                     "lora_dropout": getattr(config, "lora_dropout", None), "target_modules": found,
                     "modules_to_save": sorted(str(name) for name in saved) if saved else [],
                     "use_rslora": bool(getattr(config, "use_rslora", False))}}


def _lora_trained(candidate: CandidateFields, observed: Mapping[str, Any]) -> Dict[str, Any]:
    peft = observed.get("peft")
    if not peft or candidate.lora is not None:
        return {}
    return {"lora": LoraSettings(r=peft.get("r") or 16, alpha=peft.get("lora_alpha") or 32,
                                 dropout=peft.get("lora_dropout") or 0.0,
                                 target_modules=peft.get("target_modules") or LORA_TARGETS,
                                 modules_to_save=tuple(peft.get("modules_to_save") or ()),
                                 use_rslora=bool(peft.get("use_rslora")))}


LORA = Knob(
    "lora", fields=("lora",),
    model_keys={"use_peft": "LoRA", "lora_r": "LoRA", "lora_alpha": "LoRA", "lora_dropout": "LoRA",
                "lora_target_modules": "LoRA",
                "lora_modules_to_save": "modules trained whole beside LoRA, probed as written (peft's copy: weights, "
                                        "gradients, optimizer states)",
                "use_rslora": "LoRA's scaling alpha/sqrt(r) (no memory of its own), probed as written"},
    model=_lora_model, block=("peft", _peft_block), baseline=_lora_of, observe=_peft_of, trained=_lora_trained,
    said_after=lambda key, c: "your trainer's own LoRA (measured)")

def _quantization_model(candidate: CandidateFields, observed: Mapping[str, Any]) -> Dict[str, Any]:
    if candidate.quantization == "8bit":
        return {"load_in_8bit": True}
    if candidate.quantization != "4bit":
        return {}
    bnb = candidate.bnb or QuantSettings()  # the file's settings as written, else the rung's (nf4 + nested)
    args: Dict[str, Any] = dict(load_in_4bit=True, bnb_4bit_quant_type=bnb.quant_type, use_bnb_nested_quant=bnb.nested)
    if bnb.storage != QuantSettings().storage:
        args["bnb_4bit_quant_storage"] = bnb.storage
    return args


def _bnb_block(candidate: CandidateFields) -> Optional[Dict[str, Any]]:
    """transformers' ``BitsAndBytesConfig`` arguments but the compute dtype (best.json's ``quantization``)."""
    if candidate.quantization == "8bit":
        return {"load_in_8bit": True}
    if candidate.quantization == "4bit":  # the file's settings as probed, else the rung's (nf4 + nested)
        bnb = candidate.bnb or QuantSettings()
        return {"load_in_4bit": True, "bnb_4bit_quant_type": bnb.quant_type, "bnb_4bit_use_double_quant": bnb.nested,
                "bnb_4bit_quant_storage": bnb.storage}
    return None


def _quantization_of(run: FileRun) -> Dict[str, Any]:
    model = run.model
    found: Dict[str, Any] = {"quantization": "4bit" if model.get("load_in_4bit")
                             else "8bit" if model.get("load_in_8bit") else None}
    if model.get("load_in_4bit") or any(key in run.written for key in BNB_KEYS):  # the rung uses them too
        found["bnb"] = QuantSettings(quant_type=str(model.get("bnb_4bit_quant_type") or "nf4"),
                                     nested=bool(model.get("use_bnb_nested_quant")),
                                     storage=str(model.get("bnb_4bit_quant_storage") or "uint8"))
    return found


def _bnb_of(trainer: Any) -> Dict[str, Any]:
    model = trainer.model
    base = getattr(model, "get_base_model", lambda: model)()
    config = getattr(getattr(base, "config", None), "quantization_config", None)
    if config is None:
        return {"quantization": None}
    data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    keys = ("load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant",
            "bnb_4bit_quant_storage")
    return {"quantization": {key: _plain(data[key]) for key in keys if key in data}}


def _quantization_trained(candidate: CandidateFields, observed: Mapping[str, Any]) -> Dict[str, Any]:
    found = observed.get("quantization") or {}
    if candidate.quantization is not None or not (found.get("load_in_4bit") or found.get("load_in_8bit")):
        return {}
    if not found.get("load_in_4bit"):
        return {"quantization": "8bit"}
    bnb = QuantSettings(quant_type=str(found.get("bnb_4bit_quant_type") or "nf4"),
                        nested=bool(found.get("bnb_4bit_use_double_quant")),
                        storage=str(found.get("bnb_4bit_quant_storage") or "uint8").removeprefix("torch."))
    return {"quantization": "4bit", **({"bnb": bnb} if bnb != QuantSettings() else {})}


QUANTIZATION = Knob(
    "quantization", fields=("quantization", "bnb"), late=("bnb",),
    model_keys={"load_in_4bit": "the 4-bit base", "load_in_8bit": "the 8-bit base",
                "bnb_4bit_quant_type": "the 4-bit quant type, probed as written (nf4 or fp4: the same bytes)",
                "bnb_4bit_quant_storage": "the 4-bit storage dtype, probed as written (uint8 or a float: the same "
                                          "packed bytes)",
                "use_bnb_nested_quant": "nested quantization, probed as written (0.516 or 0.5625 B per 4-bit "
                                        "weight)"},
    model=_quantization_model, block=("quantization", _bnb_block), baseline=_quantization_of, observe=_bnb_of,
    trained=_quantization_trained, said_after=lambda key, c: "your trainer's own quantization (measured)")


def targets(found: Any) -> Any:
    """LoRA's target modules as YAML and JSON write them: a name, or a list."""
    return list(found) if isinstance(found, tuple) else found


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
