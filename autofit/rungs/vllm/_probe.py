"""vLLM in a probe (the vLLM rungs' probe step, run in the probe's child process): TRL starts it as a user's run
would, and the probe measures what it holds.

Colocate: vLLM runs inside the trainer's process (TRL's ``external_launcher``). On a GPU the probe's meter sees its
share as it sees everything of the process. On the simulated device vLLM's CPU build keeps its weights and a KV cache
of ``VLLM_CPU_KVCACHE_SPACE`` whole GiB in host memory, which is no share of the card: its tensors are held apart from
the trainer's (every call into vLLM runs with the trainer's meter suspended and a meter of vLLM's own counting), the
trainer's tensors are held against the budget less vLLM's share (``probe._metering.vllm_reserved``), and what vLLM held,
read from vLLM and from its own meter, is reported beside the ledger's figures. The CPU build cannot take TRL's weight
sync (``load_weights`` on parameters its CPU kernels repacked): the sync goes through vLLM's own ``reload_weights``
there, which re-runs the packing (the weights synced are exact).

Server: ``trl vllm-serve`` (TRL's own command line) starts beside the probe in a process group of its own, on a free
loopback port, and the trainer's client is pointed at it; the probe stops the group, and everything vLLM started in
it, whatever way the probe ends. On the CPU the server's weight sync needs NCCL on a CUDA device: it is left out
there (said in the probe's stats), so the server generates from the weights it started with.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any, Callable, ContextManager, Dict, Iterator, List

from autofit.core import Candidate
from autofit.rungs._contract import ProbeStep

CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB, whole: the least the CPU build takes
    "TORCHDYNAMO_DISABLE": "1",  # no inductor compile of vLLM's model (about 45 s on the CPU, nothing measured)
    "VLLM_USE_AOT_COMPILE": "0",
}
# vLLM's own logging, as its logger module reads it at import (vllm/logger.py, vllm/envs.py): on, at INFO at least, on
# the standard output (the probe's log), with vLLM's own handler and format; a user's config file for it left out
VLLM_LOGGER = "vllm"
VLLM_LOG_ENV = {"VLLM_CONFIGURE_LOGGING": "1", "VLLM_LOGGING_STREAM": "ext://sys.stdout"}
VLLM_LEVEL_ENV = "VLLM_LOGGING_LEVEL"
VLLM_CONFIG_ENV = "VLLM_LOGGING_CONFIG_PATH"
SERVER_WAIT_S = 600.0
SERVER_STOP_S = 20.0
# vllm-cpu's distribution is not named vllm: its command line asks importlib.metadata for "vllm" (as vLLM's own
# platform probe answers it)
SHIM = ("import importlib.metadata as m; v = m.version\n"
        "def version(name):\n"
        "    try:\n        return v(name)\n"
        "    except m.PackageNotFoundError:\n"
        "        if name == 'vllm':\n            return v('vllm-cpu') + '+cpu'\n        raise\n"
        "m.version = version\n"
        "import sys; from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; main()\n")


# The server's supervisor, the leader of its process group: it dies with the probe (the kernel sends it SIGTERM
# when its parent dies, even by SIGKILL at the probe's time limit) and takes the whole group with it (vLLM's engine
# core and worker outlive a SIGKILL of their parent otherwise).
SUPERVISOR = """
import ctypes, os, signal, subprocess, sys, time
ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)  # the probe is gone already
def stop(*_):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.2)
    os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGTERM, stop)
child = subprocess.Popen(sys.argv[3:])
code = child.wait()
stop()
"""


def supervised(command: List[str], grace_s: float = SERVER_STOP_S) -> List[str]:
    """``command`` run under the supervisor: start it with ``start_new_session=True`` so its group is its own."""
    return [sys.executable, "-c", SUPERVISOR, str(os.getpid()), str(grace_s), *command]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cpu_build() -> bool:
    try:
        importlib.metadata.version("vllm")
        return False
    except importlib.metadata.PackageNotFoundError:
        return True


def keep_vllm_lines() -> None:
    """vLLM's own start-up lines (its KV cache, blocks, maximum concurrency, CUDA graphs where it captures them) in
    the probe's log, whatever the search's environment says of vLLM's logging: vLLM configures its logger when it is
    first imported, a handler of its own on the standard output, which in a probe is probe.log (and the served vLLM's
    vllm-serve.log, its environment this one's). Before that import, the environment it reads; where a module of the
    user's imported it already, its handlers let INFO through (and with none, its records go to the root's, also
    probe.log)."""
    os.environ.update(VLLM_LOG_ENV)
    os.environ.pop(VLLM_CONFIG_ENV, None)
    level = logging.getLevelName(os.environ.get(VLLM_LEVEL_ENV, "INFO").upper())
    if not isinstance(level, int) or level > logging.INFO:
        os.environ[VLLM_LEVEL_ENV] = "INFO"
    logger = logging.getLogger(VLLM_LOGGER)
    if logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    for handler in logger.handlers:
        if handler.level > logging.INFO:
            handler.setLevel(logging.INFO)
    if not logger.handlers:
        logger.propagate = True


class VllmStep(ProbeStep):
    """vLLM started by TRL in the probe, measured (colocate) or served beside it (server)."""

    def active(self, candidate: Candidate) -> bool:
        return bool(candidate.vllm) and importlib.util.find_spec("vllm") is not None

    def before_build(self, candidate: Candidate) -> None:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(_free_port())  # TRL tries 29500 first: probes side by side collide there
        keep_vllm_lines()
        if candidate.device == "cpu":
            for key, value in CPU_ENV.items():
                os.environ.setdefault(key, value)

    def around(self, candidate: Candidate, meter: Any) -> ContextManager[Any]:
        return _around(candidate, meter)

    def read_back(self, trainer: Any, candidate: Candidate, meter: Any, handle: Any,
                  observed: Dict[str, Any]) -> Dict[str, Any]:
        figures = dict(handle)
        generation = getattr(trainer, "vllm_generation", None)
        engine = getattr(getattr(generation, "llm", None), "llm_engine", None)
        cache = getattr(getattr(engine, "vllm_config", None), "cache_config", None)
        if cache is not None:
            blocks, block = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
            figures.update(vllm_kv_cache_bytes=getattr(cache, "kv_cache_memory_bytes", None),
                           vllm_kv_tokens=blocks * block if blocks and block else None,
                           vllm_max_model_len=getattr(getattr(engine, "model_config", None), "max_model_len", None))
        observed["vllm"] = {key: value for key, value in figures.items() if not isinstance(value, (list, dict))}
        return {key: value for key, value in figures.items() if value is not None}


@contextlib.contextmanager
def _around(candidate: Candidate, meter: Any) -> Iterator[Dict[str, Any]]:
    figures: Dict[str, Any] = {"vllm": candidate.vllm}  # the probe ran vLLM, in this mode
    with contextlib.ExitStack() as stack:
        if candidate.vllm == "server":
            stack.enter_context(_served(candidate, figures, stack))
        elif candidate.device == "cpu":
            stack.enter_context(_apart(meter, figures))
        yield figures


# -- colocate on the simulated device ---------------------------------------------------------------------------------
@contextlib.contextmanager
def _apart(meter: Any, figures: Dict[str, Any]) -> Iterator[None]:
    """Every call into vLLM (its start, generation, the weight sync) with the trainer's meter suspended and vLLM's own
    meter counting: vLLM's tensors are its share's, not the trainer's."""
    from unittest import mock

    import vllm
    from torch.utils._python_dispatch import _disable_current_modes
    from trl.generation import vllm_generation

    own = type(meter)(None)  # a meter of vLLM's own, without a budget
    peaks: Dict[str, int] = {}

    def counted(phase: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            with _disable_current_modes(), own:
                own.set_phase(phase)
                try:
                    return method(*args, **kwargs)
                finally:
                    peaks[phase] = max(peaks.get(phase, 0), own.peaks().get(phase, 0))
                    figures.update({f"vllm_{name}_peak_bytes": peak for name, peak in peaks.items()})
        return call

    with contextlib.ExitStack() as patches:
        patches.enter_context(mock.patch.object(vllm.LLM, "__init__", counted("init", vllm.LLM.__init__)))
        patches.enter_context(mock.patch.object(vllm.LLM, "generate", counted("generation", vllm.LLM.generate)))
        sync = _reloading_sync if _cpu_build() else vllm_generation.VLLMGeneration.sync_weights
        figures["vllm_weight_sync"] = "reload_weights (the CPU build)" if _cpu_build() else "TRL's"
        patches.enter_context(mock.patch.object(vllm_generation.VLLMGeneration, "sync_weights",
                                                counted("weight_sync", sync)))
        yield


def _reloading_sync(self: Any) -> None:
    """TRL's sync through vLLM's own reload (the CPU build repacked the linear layers' weights at load, so
    ``load_weights`` finds no ``weight_loader``): the trainer's current weights, re-packed, prefix cache reset."""
    runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=self._iter_named_params(), is_checkpoint_format=True)
    self.llm.reset_prefix_cache()


# -- server -----------------------------------------------------------------------------------------------------------
def _server_command(candidate: Candidate, model: str, port: int) -> List[str]:
    """``trl vllm-serve`` for the probe's model folder (TRL's own command line), by the shim on the CPU build."""
    from trl.scripts.vllm_serve import build_command, make_parser

    args = ["--model", model, "--host", "127.0.0.1", "--port", str(port),
            "--max_model_len", str((candidate.prompt_length or 0) + candidate.max_length),
            "--log_level", "warning"]
    if candidate.device == "cpu":
        args += ["--dtype", "float32", "--enforce_eager", "True"]
    elif candidate.vllm_server_gpus:
        args += ["--tensor_parallel_size", str(candidate.vllm_server_gpus)]
    script, extra = make_parser().parse_args_and_config(args=args, return_remaining_strings=True)
    command = build_command(script, extra)
    if _cpu_build() and command[1:3] == ["-m", "vllm.entrypoints.cli.main"]:
        command = [command[0], "-c", SHIM] + command[3:]
    return command


@contextlib.contextmanager
def _server(candidate: Candidate, model: str, figures: Dict[str, Any]) -> Iterator[str]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    folder = candidate.probe.output_dir if candidate.probe is not None else "."
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    if candidate.device == "cuda" and candidate.vllm_server_gpus and len(visible) > candidate.ranks:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible[candidate.ranks:])  # the slot's last GPUs: the server's
    started = time.perf_counter()
    with open(os.path.join(folder, "vllm-serve.log"), "w") as log:
        server = subprocess.Popen(supervised(_server_command(candidate, model, port)), env=env, stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_until_healthy(url, server)
        figures["vllm_server_start_seconds"] = round(time.perf_counter() - started, 1)
        yield url
    finally:
        _stop_group(server)


def _wait_until_healthy(url: str, server: subprocess.Popen[Any]) -> None:
    deadline = time.monotonic() + SERVER_WAIT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"trl vllm-serve exited with code {server.returncode} before it answered (its log: "
                               "vllm-serve.log in the probe's folder)")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"trl vllm-serve did not answer at {url} within {SERVER_WAIT_S:.0f} s")


def _stop_group(server: subprocess.Popen[Any]) -> None:
    """SIGTERM to the server's process group (its supervisor stops vLLM's engine core and worker, in it too), SIGKILL
    to what is left."""
    for sig, wait in ((signal.SIGTERM, SERVER_STOP_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.wait(timeout=wait)
            os.killpg(server.pid, 0)  # the leader is gone: is anything of its group left?
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return
        time.sleep(0.5)


@contextlib.contextmanager
def _served(candidate: Candidate, figures: Dict[str, Any], stack: contextlib.ExitStack) -> Iterator[None]:
    """The server started where TRL starts its client (it knows the model's folder then), the client pointed at it;
    on the CPU, the NCCL weight sync left out (it needs CUDA). ``stack`` stops the server when the probe ends."""
    from unittest import mock

    from trl.generation import vllm_client, vllm_generation

    original = vllm_generation.VLLMGeneration._init_vllm

    @functools.wraps(original)
    def with_the_probes_server(self: Any) -> None:
        if self.mode == "server" and getattr(self, "_autofit_server", None) is None:
            self.server_base_url = stack.enter_context(_server(candidate, str(self.model.name_or_path), figures))
            self._autofit_server = self.server_base_url
        original(self)

    with contextlib.ExitStack() as patches:
        patches.enter_context(mock.patch.object(vllm_generation.VLLMGeneration, "_init_vllm", with_the_probes_server))
        if candidate.device == "cpu":
            figures["vllm_weight_sync"] = "left out: NCCL needs a CUDA device"
            patches.enter_context(mock.patch.object(vllm_client.VLLMClient, "init_communicator",
                                                    lambda self, *a, **k: None))
            patches.enter_context(mock.patch.object(vllm_generation.VLLMGeneration, "sync_weights",
                                                    lambda self: None))
        yield
