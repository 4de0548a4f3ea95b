"""vLLM's own start-up lines kept in probe.log (issue 61, item 6): a colocated vLLM logs its KV cache, maximum
concurrency and CUDA graphs on logger "vllm", with the handler it configures when first imported; the vLLM step makes
that handler write them into the probe's log whatever the search's environment says of vLLM's logging (a level above
INFO, a config file of the user's, configuration off), and whether vLLM was imported before the step or after.

Without vLLM: a probe-like process (the probe's own ``detach_into_log``, the step's ``before_build``) configures
logging as vllm/logger.py does on import (its ``DEFAULT_LOGGING_CONFIG``, read from the same variables) and logs
vLLM's lines. The vLLM lane (tests/vllm_lane) checks real probes' logs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINES = ("CPU KV cache size: 43,680 tokens", "Maximum concurrency for 24 tokens per request: 1820.00x",
         "Graph capturing finished in 3 secs, took 0.41 GiB")

PROBE = r'''
import logging, logging.config, os, sys
from autofit.core import Candidate
from autofit.probe._child import detach_into_log
from autofit.rungs.vllm._probe import VllmStep


def vllm_imported():
    """What vllm/logger.py does when first imported (``_configure_vllm_root_logger``)."""
    if os.environ.get("VLLM_CONFIGURE_LOGGING", "1") == "0":
        return
    if os.environ.get("VLLM_LOGGING_CONFIG_PATH"):
        raise SystemExit("vLLM would read the user's logging config, not log here")
    level = os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper()
    logging.config.dictConfig({
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"vllm": {"format": "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"}},
        "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "vllm", "level": level,
                              "stream": os.environ.get("VLLM_LOGGING_STREAM", "ext://sys.stdout")}},
        "loggers": {"vllm": {"handlers": ["vllm"], "level": level, "propagate": False}}})


log_path, when, step = sys.argv[1:]
detach_into_log(log_path)
if when == "before":  # a module of the user's imported vLLM before the step
    vllm_imported()
if step == "step":
    VllmStep().before_build(Candidate("grpo", "tiny-qwen2", "cpu", micro_batch=2, grad_accum=1, max_length=16,
                                      prompt_length=8, vllm="colocate"))
if when == "after":  # TRL imports vLLM when it builds the trainer
    vllm_imported()
logging.getLogger("vllm.v1.core.kv_cache_utils").info("CPU KV cache size: 43,680 tokens")
logging.getLogger("vllm.v1.core.kv_cache_utils").info("Maximum concurrency for 24 tokens per request: 1820.00x")
logging.getLogger("vllm.v1.worker.gpu_model_runner").info("Graph capturing finished in 3 secs, took 0.41 GiB")
logging.getLogger("vllm.config").debug("a debug line of vLLM's")
'''


def _probe_log(tmp_path: Path, when: str, env: dict, step: str = "step") -> str:
    log = tmp_path / "probe.log"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    environ.update(env, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", PROBE, str(log), when, step], env=environ, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr + log.read_text() if log.exists() else done.stderr
    return log.read_text()


USERS = {
    "vLLM's defaults": {},
    "level WARNING, a config file": {"VLLM_LOGGING_LEVEL": "WARNING", "VLLM_LOGGING_CONFIG_PATH": "/theirs.json"},
    "configuration off": {"VLLM_CONFIGURE_LOGGING": "0"},
}


@pytest.mark.parametrize("when", ["after", "before"])
@pytest.mark.parametrize("users", list(USERS))
def test_vllm_s_start_up_lines_land_in_probe_log_once(tmp_path, when, users):
    if when == "before" and "VLLM_LOGGING_CONFIG_PATH" in USERS[users]:
        pytest.skip("vLLM imported with the user's config file logs where that file says: not the probe's to move")
    text = _probe_log(tmp_path, when, USERS[users])
    for line in LINES:
        assert text.count(line) == 1, (line, text)
    assert "a debug line" not in text


def test_without_the_step_a_user_s_warning_level_drops_them(tmp_path):
    """What the step mends: vLLM's handler at the user's WARNING lets none of its start-up lines through."""
    text = _probe_log(tmp_path, "after", {"VLLM_LOGGING_LEVEL": "WARNING"}, step="none")
    assert not any(line in text for line in LINES), text
