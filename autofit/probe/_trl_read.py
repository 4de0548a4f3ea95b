"""TRL's parser for the search's process: ``autofit.probe._trl_config`` run in a process forked from the probe server.

The search's process never imports torch, so a ``--config`` file is read by TRL's parser in a process of its own. A
fresh interpreter pays TRL's config imports (transformers' training arguments, peft, bitsandbytes, torch's compiler:
about 12 s of CPU) for every file; a process forked from the probe server (``autofit.probe._runner``), which has
imported them once, reads a file in a fraction of a second, and the server is the one the search's probes use. The
child runs exactly what ``python -m autofit.probe._trl_config ALGO FILE FLAGS`` runs, with the caller's environment
and working directory and the text on its standard input, and its output is handed back as that command's would be.
Where the server cannot be used (it cannot start, or CUDA was initialized in it: a process forked from it could not
hide the GPU), the fresh interpreter reads the file, as before.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence

from autofit.probe._runner import PRELOAD, _main_module_left_alone
from autofit.probe._trl_config import WORLD_SIZE_ENV

log = logging.getLogger(__name__)

__all__ = ["WORLD_SIZE_ENV", "read_trl_config"]

UNFORKABLE = 86  # the forked child's exit code where CUDA was initialized in the server: nothing ran


def read_trl_config(algo: str, path: str, flags: Sequence[str], text: str, env: Mapping[str, str],
                    timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``python -m autofit.probe._trl_config ALGO PATH FLAGS`` given ``text`` on its standard input, with ``env``; its
    exit code, standard output and standard error. Raises ``subprocess.TimeoutExpired`` after ``timeout_s`` and
    ``OSError`` where no process could run it, as ``subprocess.run`` does."""
    argv = [algo, path, *flags]
    command = [sys.executable, "-m", "autofit.probe._trl_config", *argv]
    try:
        done = _forked(command, argv, text, dict(env), timeout_s)
    except (OSError, ValueError, EOFError) as exc:  # no server here (a sandbox without fork, a closed pipe)
        log.debug("TRL's parser in a fresh interpreter: the probe server could not fork it (%s)", exc)
        done = None
    if done is None:
        return subprocess.run(command, env=dict(env), input=text, capture_output=True, text=True, encoding="utf-8",
                              errors="replace", timeout=timeout_s)
    return done


def _forked(command: Sequence[str], argv: Sequence[str], text: str, env: Dict[str, str],
            timeout_s: float) -> Optional[subprocess.CompletedProcess[str]]:
    """The command run in a process forked from the probe server; None where that server cannot run it."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))  # the probes' server: started here if no probe has started it
    with tempfile.TemporaryDirectory(prefix="autofit-config-read-") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        process = context.Process(
            target=_child, args=(list(argv), text, str(out), str(err), os.getcwd(), env),
            name="autofit-trl-config")
        with _main_module_left_alone(context):
            process.start()
        try:
            process.join(timeout_s)
            if process.is_alive():
                process.kill()
                process.join()
                raise subprocess.TimeoutExpired(list(command), timeout_s)
        except BaseException:  # interrupted (Ctrl-C) or timed out: the child goes with us
            if process.is_alive():
                process.kill()
                process.join()
            raise
        if process.exitcode == UNFORKABLE:
            log.debug("TRL's parser in a fresh interpreter: CUDA was initialized in the probe server")
            return None

        def read(file: Path) -> str:
            return file.read_text(encoding="utf-8", errors="replace") if file.exists() else ""

        code = process.exitcode if process.exitcode is not None else 1
        return subprocess.CompletedProcess(list(command), code, read(out), read(err))


def _child(argv: Sequence[str], text: str, out: str, err: str, cwd: str, env: Dict[str, str]) -> None:
    """The forked process: ``autofit.probe._trl_config`` (imported here, never in the search's process) run as its
    command would be; exits ``UNFORKABLE`` at once where CUDA was initialized in the server (the GPU could not be
    hidden from this process)."""
    import signal

    from autofit.probe._child import inherited_cuda

    if inherited_cuda() is not None:
        sys.exit(UNFORKABLE)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the search's to handle: it takes this process down
    from autofit.probe._trl_config import forked_main

    forked_main(list(argv), text, out, err, cwd, env)
