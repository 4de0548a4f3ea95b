"""A candidate training configuration: what one probe runs and what the export writes.

A ``Candidate`` is plain, frozen data that crosses the process boundary to a probe worker (it is pickled) and
is stored in the Optuna study as JSON. Trainer factories read it through three small methods:
``training_args()`` for the TRL config dataclass, ``peft_config()`` and ``quantization_config()`` for the
trainer's constructor arguments. Its fields are ``autofit.core._candidate_fields``'s, below the knob table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Dict, Optional

from autofit.core._algorithms import algorithm_names
from autofit.core._candidate_fields import CandidateFields
from autofit.core._engines import DDP, DEEPSPEED, engine_of
from autofit.core._knob_table import USE_VLLM
from autofit.core._knobs import blocks, knob_training_args, late_fields
from autofit.core._settings import LoraSettings, QuantSettings

RL_ALGOS = algorithm_names(rl=True)
# Micro-batches per optimizer step that a probe of SFT or a reward model runs: from the second on, the gradients
# are resident and nothing else grows, so more would cost time and show nothing (a test measures it). RL keeps all:
# TRL generates for the whole generation batch (micro-batch x steps_per_generation) at once.
PROBE_ACCUMULATION = 2

PROBE_DDP_TIMEOUT_S = 300


@dataclass(frozen=True)
class Candidate(CandidateFields):
    @property
    def effective_batch(self) -> int:
        """Sequences per optimizer step, over every rank."""
        return self.micro_batch * self.grad_accum * self.ranks

    @property
    def engine(self) -> Optional[str]:
        """The engine the probe runs under (its accelerate config): offload, sharding, or data parallel."""
        return self.named_engine or (DDP if self.ranks > 1 else None)

    @property
    def named_engine(self) -> Optional[str]:  # the optimizer offload's, else the sharding's; not data parallel's
        return self.offload or self.sharding

    @property
    def optimizer_offload(self) -> bool:  # zero2-offload's (``Engine.optimizer_offload``), not an offloading sharding's
        return bool(self.offload)

    @property
    def tokens_per_step(self) -> int:
        return self.effective_batch * (self.max_length + (self.prompt_length or 0))

    @property
    def probe_accumulation(self) -> int:
        """Micro-batches per optimizer step as run: all of them outside probes, for RL, or when asked."""
        if self.probe is None or self.probe.full_accumulation or self.is_rl:
            return self.grad_accum
        return min(self.grad_accum, PROBE_ACCUMULATION)

    def with_rung(self, name: str, **changes: Any) -> Candidate:
        return dataclasses.replace(self, rungs=self.rungs + (name,), **changes)

    # -- what factories read ----------------------------------------------------------------------------------
    def training_args(self) -> Dict[str, Any]:
        """Keyword arguments for the algorithm's TRL config class (SFTConfig, ...): the knobs' (``autofit.core._knobs``)
        over the user's own, and how a probe runs on its device."""
        args = knob_training_args(self)
        if self.device == "cpu":
            # DeepSpeed runs only where accelerate is not told use_cpu (the probe hides GPUs instead).
            args.update(bf16=False)
            sharded = engine_of(self.sharding)
            if not self.offload and not (sharded is not None and sharded.deepspeed):
                args["use_cpu"] = True
        if self.probe is not None:
            args.update(
                gradient_accumulation_steps=self.probe_accumulation,
                output_dir=self.probe.output_dir,
                max_steps=self.probe.steps,
                save_strategy="no",
                report_to="none",
                logging_steps=1,
                disable_tqdm=True,
                dataloader_num_workers=0,
            )
            if self.ranks > 1:  # a rank left waiting for a dead one gives up (the runner kills it before that)
                args["ddp_timeout"] = PROBE_DDP_TIMEOUT_S
            if self.unit.counts_episodes:  # PPO counts episodes, not steps; its sample generations are evaluation only
                args.update(total_episodes=self.effective_batch * self.probe.steps, num_sample_generations=0)
            elif self.is_rl:  # the worst case: every completion runs to max_completion_length (vLLM's SamplingParams
                # call it min_tokens, transformers' generate min_new_tokens)
                forced = "min_tokens" if args.get(USE_VLLM) else "min_new_tokens"
                args["generation_kwargs"] = {**(args.get("generation_kwargs") or {}), forced: self.max_length}
        return args

    def peft_config(self) -> Any:
        """A peft ``LoraConfig`` or None."""
        settings = blocks(self)["peft"]
        if settings is None:
            return None
        from peft import LoraConfig

        return LoraConfig(**{k: v for k, v in settings.items() if k != "type"},
                          task_type="SEQ_CLS" if self.unit.sequence_classifier else "CAUSAL_LM")

    def quantization_config(self) -> Any:
        """A transformers ``BitsAndBytesConfig`` or None."""
        settings = blocks(self)["quantization"]
        if settings is None:
            return None
        import torch
        from transformers import BitsAndBytesConfig

        if self.quantization == "4bit":
            settings["bnb_4bit_compute_dtype"] = torch.float32 if self.device == "cpu" else torch.bfloat16
        return BitsAndBytesConfig(**settings)  # type: ignore[no-untyped-call]

    # -- identity and storage ---------------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("probe")
        data["env"] = dict(self.env)
        data["user_args"] = dict(self.user_args)
        data["rungs"] = list(self.rungs)
        return data

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> Candidate:
        data = dict(data)
        data["env"] = tuple(sorted(data.get("env", {}).items()))
        data["user_args"] = tuple(sorted(data.get("user_args", {}).items()))
        data["rungs"] = tuple(data.get("rungs", ()))
        if data.get("lora") is not None:
            data["lora"] = LoraSettings(**data["lora"])
        if data.get("bnb") is not None:
            data["bnb"] = QuantSettings(**data["bnb"])
        return cls(**data)

    def key(self) -> str:
        """Stable identity of what is measured (the rung names that led here do not change the measurement). Fields
        added after studies were stored are left out at their default, so those studies keep their keys."""
        data = self.to_dict()
        data.pop("rungs")
        data.pop("replaces")  # words, like the rung names: the measurement is the same
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for late in late_fields():
            if data.get(late) in (defaults[late], None, False):
                data.pop(late, None)
        if data.get("lora"):
            for late, unset in LoraSettings.LATE.items():
                if data["lora"].get(late) in (unset, ()):
                    data["lora"].pop(late)
        return hashlib.sha1(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def describe(self) -> str:
        parts = [f"mb={self.micro_batch}x{self.grad_accum}" + (f"x{self.ranks}" if self.ranks > 1 else ""),
                 f"len={self.max_length}"]
        if ((own := bool(dict(self.user_args).get("deepspeed"))) or self.ranks > 1) and not self.offload:
            parts.append(self.sharding or (DEEPSPEED if own else DDP))  # the user's own DeepSpeed configuration
        if self.num_generations is not None:
            parts.append(f"gen={self.num_generations}")
        if self.vllm:
            parts.append(f"vllm-{self.vllm}" + (f"@{self.vllm_utilization:g}" if self.vllm_utilization else "")
                         + (f"/ctx{self.vllm_max_model_length}" if self.vllm_max_model_length else "")
                         + "/sleep" * self.vllm_sleep + f"/{self.vllm_server_gpus}gpu" * bool(self.vllm_server_gpus))
        if self.liger:
            parts.append("liger")
        if self.checkpointing:
            parts.append("ckpt")
        if self.activation_offload:
            parts.append("act-offload")
        if self.precompute_ref:
            parts.append("ref-precomputed")
        if self.dtype:
            parts.append(self.dtype)
        if self.optim:
            parts.append(self.optim)
        if self.offload:
            parts.append(self.offload)
        if self.quantization:
            parts.append(f"q{self.quantization}")
        if self.lora:
            parts.append(f"lora{self.lora.r}" + ("+" + ",".join(self.lora.modules_to_save)
                                                 if self.lora.modules_to_save else ""))
        if self.attn_implementation:
            parts.append(self.attn_implementation)
        return " ".join(parts)
