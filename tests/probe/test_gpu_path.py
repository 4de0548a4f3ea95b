"""GPU-only failure classes, caught on the CPU: CUDA initialized before a probe is forked, the spawn fallback, and
probes that fail for reasons that are not memory (exit 4, never "nothing fits").

On a CPU-only torch, importing peft or bitsandbytes does not touch CUDA, so the bug that stopped every probe on
an H100 (docs: shared notes gpu-2026-11-22) is invisible unless CUDA is faked: these tests make torch report a GPU
and record every attempt to initialize CUDA."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autofit import cli

TESTS = Path(__file__).resolve().parents[1]

# torch reports a CUDA build with one device, and any initialization of CUDA is recorded (with its caller) and refused.
INSTRUMENT_CUDA = textwrap.dedent("""
    import json, sys, traceback
    import torch

    torch.version.cuda = "13.0"

    calls = []

    def record(*args, **kwargs):
        calls.append("".join(traceback.format_stack(limit=10)))
        raise RuntimeError("instrumented: CUDA initialization attempted")

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda._lazy_init = record
    torch.cuda.init = record
""")


def run_instrumented(body: str) -> dict:
    script = INSTRUMENT_CUDA + textwrap.dedent(body) + textwrap.dedent("""
        print("RESULT " + json.dumps({"calls": calls,
                                      "imported": sorted(m for m in ("peft", "bitsandbytes") if m in sys.modules)}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    line = next((printed for printed in done.stdout.splitlines() if printed.startswith("RESULT ")), None)
    assert line is not None, done.stderr[-3000:]
    return json.loads(line[len("RESULT "):])


def test_the_probe_server_preload_never_initializes_cuda():
    found = run_instrumented("""
        try:
            import autofit.probe._preload
        except Exception as exc:  # an import that reached CUDA raises the instrument's error
            calls.append(f"preload raised {exc!r}")
        else:
            assert autofit.probe._preload.cuda_initialized is False
    """)
    assert found["calls"] == [], "the preload initializes CUDA:\n" + "\n".join(found["calls"])
    assert found["imported"] == []  # probes import peft and bitsandbytes themselves, after the fork


def test_a_torch_built_without_cuda_preloads_peft_and_bitsandbytes():
    # Nothing there can initialize CUDA, so the probe server imports them once instead of every probe.
    script = "import sys, torch, autofit.probe._preload as p; print(torch.version.cuda, p.cuda_initialized, " \
             "sorted(m for m in ('peft', 'bitsandbytes') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    import torch

    if torch.version.cuda is not None:
        pytest.skip("torch here is built with CUDA")
    assert done.stdout.split(None, 2) == ["None", "False", "['bitsandbytes', 'peft']\n"], done.stderr[-2000:]
    # bitsandbytes' CPU backend asks the hub's kernels package for a kernel on import (transformers 5.25 installs it):
    # its warnings and bitsandbytes' own would reach the terminal of every search from the probe server
    assert done.stderr == "", done.stderr[-2000:]


def test_the_instrument_sees_what_initializes_cuda():
    # The check above can fail: on a GPU machine importing peft initializes CUDA (through bitsandbytes), and the
    # instrumented CPU sees exactly that.
    found = run_instrumented("""
        try:
            import peft
        except Exception:
            pass
    """)
    assert found["calls"], "importing peft should reach CUDA initialization"
    assert any("bitsandbytes" in call for call in found["calls"])


def test_a_server_with_cuda_initialized_falls_back_to_spawn(tmp_path):
    # The server's preload "initializes CUDA" (tests/fake_cuda_server.py): the forked probe reports a bad fork,
    # the runner switches to spawn for the rest of the search, and the probe, run again, really measures.
    script = tmp_path / "probe_once.py"
    script.write_text(textwrap.dedent(f"""
        import json, logging, sys
        from autofit.core._candidate import Candidate
        from autofit.probe._runner import ProcessRunner

        if __name__ == "__main__":
            logging.basicConfig(level=logging.WARNING)
            runner = ProcessRunner("autofit.probe.algos.sft:build_trainer", 2**30, {str(tmp_path)!r},
                                   preload=("fake_cuda_server", "autofit.probe._preload"))
            candidate = Candidate("sft", "tiny-qwen2", "cpu", micro_batch=2, grad_accum=1, max_length=16)
            first = runner.run(candidate, 2)
            second = runner.run(candidate.replace(micro_batch=1, grad_accum=2), 2)
            print("RESULT " + json.dumps({{"first": first.to_dict(), "second": second.to_dict(),
                                            "method": runner.start_method}}))
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    line = next((printed for printed in done.stdout.splitlines() if printed.startswith("RESULT ")), None)
    assert line is not None, done.stderr[-3000:]
    found = json.loads(line[len("RESULT "):])
    assert found["method"] == "spawn"
    for result in (found["first"], found["second"]):
        assert result["outcome"] == "OK", result["error"]
        assert result["peak_bytes"] > 0 and result["steps"] == 2
    assert done.stderr.count("using the spawn start method") == 1  # said once
    logs = "".join(p.read_text() for p in tmp_path.glob("probes/*/probe.log"))
    assert "bad fork" in logs


def test_failing_the_same_way_on_every_candidate_exits_4(tmp_path, capsys):
    code = cli.main(["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "1GiB",
                     "--max-length", "16", "--factory", "probe_factories:disk_full", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_PROBES_CANNOT_RUN, err
    assert "No space left on device" in err and "free disk space" in err and "probe.log" in err
    assert "nothing fits" not in err
    assert len(list(tmp_path.glob("probes/*/result.json"))) == 2  # stopped after the second probe
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["fits"] is False and "No space left" in best["stopped"]
    assert not (tmp_path / "best.yaml").exists()


def test_exit_4_is_in_the_help():
    done = subprocess.run([sys.executable, "-m", "autofit.cli", "search", "--help"], capture_output=True, text=True)
    assert re.search(r"^  4 +probes_cannot_run: probes cannot run here", done.stdout, re.MULTILINE), done.stdout


@pytest.mark.slow
def test_gpu_check_page_from_a_cpu_scenario(tmp_path):
    # make gpu-check's plumbing on the CPU: a search, its plain-TRL replay (no autofit code in that process), the
    # page with the command, the answer, every probe and the replay's verdict.
    from benchmarks import gpu_check

    scenario = gpu_check.Scenario("tiny-sft", ["--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "300MiB",
                                               "--max-length", "32", "--verify-steps", "3"],
                                  "tiny SFT on the simulated meter", replay_steps=3)
    page = tmp_path / "page.md"
    assert gpu_check.main(["--out", str(tmp_path / "runs"), "--page", str(page)], scenarios=[scenario]) == 0
    best = json.loads((tmp_path / "runs" / "tiny-sft" / "best.json").read_text())
    replay = json.loads((tmp_path / "runs" / "tiny-sft" / "replay.json").read_text())
    assert replay["outcome"] == "OK" and replay["steps"] == 3 and replay["autofit_imported"] is False
    text = page.read_text()
    assert "$ autofit search --model tiny-qwen2" in text and "# exit 0" in text
    assert f"over {best['verified']['steps']} steps" in text
    assert text.count("| probe |") + text.count("| verify |") == len(best["candidates"])
    assert "Plain-TRL replay (3 steps" in text and "no OOM" in text
    # a second call reuses the finished search (the study resumes) and the replay
    assert gpu_check.main(["--out", str(tmp_path / "runs"), "--page", str(page)], scenarios=[scenario]) == 0
    runs = json.loads((tmp_path / "runs" / "tiny-sft" / "runs.json").read_text())
    assert len(runs) == 2 and runs[1]["exit"] == 0


def test_gpu_check_replays_a_hub_model_from_the_probes_checkpoint(tmp_path):
    # The GPU machines cannot download: a replay of Qwen2.5-0.5B's answer loads the weightless checkpoint the probes
    # loaded; a folder the user gave stays as it is.
    from autofit.probe import _virtual_checkpoint as virtual_checkpoint
    from benchmarks import gpu_check

    best = tmp_path / "best.json"
    best.write_text(json.dumps({"model": "Qwen/Qwen2.5-0.5B",
                                "model_args": {"model_name_or_path": "Qwen/Qwen2.5-0.5B"}}))
    flag, folder = gpu_check.offline_model(best)
    assert flag == "--model-path" and virtual_checkpoint.is_virtual(folder) and "Qwen--Qwen2.5-0.5B" in folder
    best.write_text(json.dumps({"model": str(tmp_path), "model_args": {"model_name_or_path": str(tmp_path)}}))
    assert gpu_check.offline_model(best) == []
