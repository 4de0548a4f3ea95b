"""Test doubles for the search: a probe runner whose memory and speed are known formulas of the candidate.

``FormulaRunner`` implements the ``autofit.probe._runner.Runner`` protocol (``run(candidate, steps) -> ProbeResult``)
without training anything, so a whole search runs in milliseconds and tests can derive the exact expected
choice from the same formula (``runner.peak_bytes(candidate)``, ``runner.tokens_per_second(candidate)``).

Memory model (all integers, in bytes), with ``W = weight_bytes`` the 16-bit weights of the full model:

    weights     = W, W // 2 with quantization "8bit", W // 4 with "4bit"
    trainable   = W without LoRA, W // lora_divisor with LoRA (only the adapters train)
    grads       = trainable
    optimizer   = 4 * trainable (AdamW: two fp32 states), 1 * trainable with optim "adamw_bnb_8bit"
    (dtype "bfloat16": weights, trainable and AdamW's states halved; 8-bit states stay 1 * the fp32-sized trainable)
    (offload: gradients and optimizer states are host memory, not counted)
    activations = micro_batch * max_length * act_bytes_per_token, divided by ckpt_divisor with checkpointing
                  and by act_offload_divisor with activation offloading; times liger_act_share with Liger's kernels
    peak        = weights + grads + optimizer + activations
                  (+ fragmentation_bytes unless the candidate's env sets expandable segments)
                  (+ verify_extra_bytes when steps >= verify_from_steps, i.e. for the verification run)

A candidate whose peak is above ``budget_bytes`` returns ``Outcome.OOM`` with that peak (never an exception).
Otherwise ``Outcome.OK`` with

    tokens_per_second = base_tps * micro_batch / (micro_batch + 1), times ckpt_speed with checkpointing,
                        offload_speed with optimizer offload, act_offload_speed with activation offloading and
                        liger_speed with Liger's kernels

so a bigger micro-batch is faster and checkpointing is slower.

Failure injection: ``fail_if(candidate, steps)`` may return an ``Outcome`` (CRASH, TIMEOUT, INVALID) for that
run, or a whole ``ProbeResult`` (a fault, a cause); ``interrupt_on_call=N`` raises ``KeyboardInterrupt`` on the N-th
call (1-based), which is not recorded in ``calls`` because it did not finish.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

from autofit.core import RL_ALGOS, Candidate, Outcome, ProbeResult, SearchOptions, SearchSpec

KiB = 2**10
MiB = 2**20

EIGHT_BIT_OPTIM = "adamw_bnb_8bit"
ALLOC_ENV = "PYTORCH_ALLOC_CONF"


def spec_of(*, device: str = "cpu", budget_bytes=None, ranks: int = 1, **fields) -> SearchSpec:
    """A question planned without asking the machine (no NVML, no model checks), for tests: ``SearchOptions``' fields
    by name, plus the resolved device, each GPU's memory (``budget_bytes``) and the ranks. Older names are read too:
    ``max_length``/``min_length`` of an RL algorithm are its completion's, ``prompt_length`` is
    ``max_prompt_length``, ``vllm``/``vllm_utilization`` are ``use_vllm``/``vllm_gpu_memory_utilization``,
    ``user_args`` are ``training_args``, ``factory`` is the identity of a user's factory."""
    renames = {"prompt_length": "max_prompt_length", "vllm": "use_vllm",
               "vllm_utilization": "vllm_gpu_memory_utilization", "user_args": "training_args"}
    fields = {renames.get(name, name): value for name, value in fields.items()}
    if fields.get("algo") in RL_ALGOS:
        for short, long in (("max_length", "max_completion_length"), ("min_length", "min_completion_length")):
            if short in fields:
                fields[long] = fields.pop(short)
    factory = fields.pop("factory", None)
    options = SearchOptions(device=device, **fields)
    return SearchSpec.plan(options, device=device, gpu_bytes=budget_bytes, ranks=ranks, factory=factory)


def formula_spec(out_dir, budget: int, **changes) -> SearchSpec:
    """The question a ``FormulaRunner`` search answers: tiny-qwen2 on CUDA (the speed and offload rungs apply),
    effective batch 8, no headroom and no memory model (the formula is the truth)."""
    fields = dict(model="tiny-qwen2", budget_bytes=budget, out_dir=Path(out_dir), device="cuda", max_length=512,
                  effective_batch=8, verify_steps=10, headroom=0.0, predict=False)
    fields.update(changes)
    return spec_of(**fields)


@dataclass(frozen=True)
class Call:
    candidate: Candidate
    steps: int
    result: ProbeResult


class FormulaRunner:
    def __init__(
        self,
        budget_bytes: int,
        *,
        weight_bytes: int = 100 * MiB,
        act_bytes_per_token: int = 64 * KiB,
        ckpt_divisor: int = 4,
        lora_divisor: int = 50,
        base_tps: float = 10_000.0,
        ckpt_speed: float = 0.7,
        offload_speed: float = 0.5,
        act_offload_divisor: int = 8,
        act_offload_speed: float = 0.85,
        liger_act_share: float = 0.75,
        liger_speed: float = 1.1,
        fragmentation_bytes: int = 0,
        verify_extra_bytes: int = 0,
        verify_from_steps: int = 10,
        fail_if: Optional[Callable[[Candidate, int], Union[None, Outcome, ProbeResult]]] = None,
        interrupt_on_call: Optional[int] = None,
    ):
        self.budget_bytes = budget_bytes
        self.weight_bytes = weight_bytes
        self.act_bytes_per_token = act_bytes_per_token
        self.ckpt_divisor = ckpt_divisor
        self.lora_divisor = lora_divisor
        self.base_tps = base_tps
        self.ckpt_speed = ckpt_speed
        self.offload_speed = offload_speed
        self.act_offload_divisor = act_offload_divisor
        self.act_offload_speed = act_offload_speed
        self.liger_act_share = liger_act_share
        self.liger_speed = liger_speed
        self.fragmentation_bytes = fragmentation_bytes
        self.verify_extra_bytes = verify_extra_bytes
        self.verify_from_steps = verify_from_steps
        self.fail_if = fail_if
        self.interrupt_on_call = interrupt_on_call
        self.calls: List[Call] = []
        self.attempts = 0  # calls started, the interrupted one included

    # -- the formula ------------------------------------------------------------------------------------------
    def state_bytes(self, candidate: Candidate) -> int:
        """Weights + gradients + optimizer states."""
        weights = {None: self.weight_bytes, "8bit": self.weight_bytes // 2, "4bit": self.weight_bytes // 4}[
            candidate.quantization
        ]
        trainable = self.weight_bytes if candidate.lora is None else self.weight_bytes // self.lora_divisor
        optimizer = trainable * (1 if candidate.optim == EIGHT_BIT_OPTIM else 4)
        if candidate.dtype == "bfloat16":
            weights, trainable = weights // 2, trainable // 2
            optimizer = optimizer if candidate.optim == EIGHT_BIT_OPTIM else optimizer // 2
        if candidate.offload:
            return weights
        return weights + trainable + optimizer

    def activation_bytes(self, candidate: Candidate) -> int:
        act = candidate.micro_batch * candidate.max_length * self.act_bytes_per_token
        act = act // self.ckpt_divisor if candidate.checkpointing else act
        act = int(act * self.liger_act_share) if candidate.liger else act
        return act // self.act_offload_divisor if candidate.activation_offload else act

    def peak_bytes(self, candidate: Candidate, steps: int = 2) -> int:
        extra = self.verify_extra_bytes if steps >= self.verify_from_steps else 0
        if "expandable_segments:True" not in dict(candidate.env).get(ALLOC_ENV, ""):
            extra += self.fragmentation_bytes
        return self.state_bytes(candidate) + self.activation_bytes(candidate) + extra

    def tokens_per_second(self, candidate: Candidate) -> float:
        mb = candidate.micro_batch
        return (self.base_tps * mb / (mb + 1) * (self.ckpt_speed if candidate.checkpointing else 1.0)
                * (self.offload_speed if candidate.offload else 1.0)
                * (self.act_offload_speed if candidate.activation_offload else 1.0)
                * (self.liger_speed if candidate.liger else 1.0))

    def fits(self, candidate: Candidate, steps: int = 2) -> bool:
        return self.peak_bytes(candidate, steps) <= self.budget_bytes

    # -- the Runner protocol ----------------------------------------------------------------------------------
    def run(self, candidate: Candidate, steps: int, **plan) -> ProbeResult:
        self.attempts += 1
        if self.interrupt_on_call is not None and self.attempts == self.interrupt_on_call:
            raise KeyboardInterrupt
        result = self._result(candidate, steps)
        self.calls.append(Call(candidate, steps, result))
        return result

    def _result(self, candidate: Candidate, steps: int) -> ProbeResult:
        failure = self.fail_if(candidate, steps) if self.fail_if is not None else None
        if isinstance(failure, ProbeResult):
            return failure
        if failure is not None:
            return ProbeResult(failure, steps=steps, error=f"fake {failure.value}", error_phase="train")
        peak = self.peak_bytes(candidate, steps)
        if peak > self.budget_bytes:
            return ProbeResult(Outcome.OOM, peak_bytes=peak, steps=steps, error="fake OOM", error_phase="train")
        return ProbeResult(
            Outcome.OK, peak_bytes=peak, steps=steps, seconds=0.01, tokens_per_second=self.tokens_per_second(candidate)
        )

    # -- what tests read --------------------------------------------------------------------------------------
    @property
    def candidates(self) -> List[Candidate]:
        return [call.candidate for call in self.calls]

    def probes(self, steps: Optional[int] = None) -> List[Call]:
        return [call for call in self.calls if steps is None or call.steps == steps]


def process_running(pid: int, start: int) -> bool:
    """The process ``pid`` that started at ``start`` (clock ticks) is there and not a zombie (a dead probe its
    lingering server has not reaped yet)."""
    from autofit.machine._outdir import process_start_ticks

    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X") and process_start_ticks(pid) == start


def dashboard_getter(journal: Path) -> Callable[[str], Dict[str, Any]]:
    """GET a path of optuna-dashboard's own HTTP API (the WSGI app its command serves) on a study journal: the JSON it
    answers, after checking it answered 200."""
    import io
    import json

    import pytest

    app = pytest.importorskip("optuna_dashboard").wsgi(str(journal))

    def get(path: str) -> Dict[str, Any]:
        statuses: List[str] = []
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": "", "SERVER_NAME": "localhost",
                   "SERVER_PORT": "80", "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO()}
        body = b"".join(app(environ, lambda status, headers, *_: statuses.append(status)))
        assert statuses == ["200 OK"], (path, statuses, body[:300])
        return json.loads(body)

    return get


# A TRL file with a ZeRO-2 configuration of the user's own, as a TRL user writes it for the Trainer ("auto" for what
# it fills); it runs on the CPU meter
DEEPSPEED = """\
model_name_or_path: tiny-qwen2
max_length: 64
per_device_train_batch_size: 2
deepspeed:
  zero_optimization:
    stage: 2
    reduce_bucket_size: 1.0e+6
  train_micro_batch_size_per_gpu: auto
  gradient_accumulation_steps: auto
  train_batch_size: auto
  zero_force_ds_cpu_optimizer: false
"""


def at_door_values(values):
    """A door's option values over its launch's (``autofit.launch.at_door``): the question reads the launch again
    where a test does not hand it on."""
    from autofit.launch import at_door

    return at_door(values)[0]


def refused_in_one_line(capsys, argv, *, nothing_on_stdout: bool = False) -> str:
    """The CLI's refusal of ``argv``: exit 2 and one ``autofit: error:`` line on stderr, no traceback; that line."""
    from autofit import cli

    code = cli.main(argv)
    out = capsys.readouterr()
    assert code == 2, out.out[-800:] + out.err[-800:]
    assert out.err.startswith("autofit: error: ") and out.err.count("\n") == 1, out.err
    assert "Traceback" not in out.err
    if nothing_on_stdout:
        assert out.out == "", out.out
    return out.err


def estimate_cli(*args: str) -> str:
    """``autofit estimate ARGS`` as a user runs it, in a process of its own; its stdout (exit 0 asserted)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "autofit.cli", "estimate", *args], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout
