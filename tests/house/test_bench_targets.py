"""Every benchmark target has a quick mode and `make test` runs it (issue 36, item 7: `make bench` broke unseen).
The quick runs themselves are `make bench-quick`, the last step of `make test`; this checks the wiring in a second."""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAKE = ["make", "-s", "-n", "VENV=/nonexistent", "-o", "/nonexistent/.installed"]


def dry(*args: str) -> str:
    done = subprocess.run(MAKE + list(args), cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def bench_targets() -> list:
    phony = next(line for line in (REPO / "Makefile").read_text().splitlines() if line.startswith(".PHONY:"))
    return [name for name in phony.split()[1:] if name.startswith("bench") and name != "bench-quick"]


def test_every_bench_target_has_a_quick_mode_that_writes_nothing():
    targets = bench_targets()
    assert {"bench", "bench-families", "bench-public"} <= set(targets)
    for target in targets:
        commands = [line for line in dry(target, "QUICK=1").splitlines() if "-m benchmarks." in line]
        assert commands, target
        for command in commands:
            assert "--quick" in command and "--write" not in command and "docs/" not in command, (target, command)
        full = [line for line in dry(target).splitlines() if "-m benchmarks." in line]
        assert all("--quick" not in line for line in full), target


def test_make_test_runs_the_quick_benchmarks_of_every_target():
    assert "bench-quick" in dry("test")
    quick = [line for line in dry("bench-quick").splitlines() if "-m benchmarks." in line]
    assert quick and all("--quick" in line for line in quick)
    named = {re.search(r"-m benchmarks\.(\w+)", line).group(1) for line in quick}
    for target in bench_targets():  # what each target runs, bench-quick runs
        assert set(re.findall(r"-m benchmarks\.(\w+)", dry(target))) <= named, target


def test_the_gate_question_has_its_model_and_refuses_what_it_would_ignore(capsys):
    """`make bench` runs search_speed --gate only in full (it has no quick mode): its model folder and its refusals
    are checked here, so that a moved folder or a dropped flag check is not first met by a 50-minute run."""
    import pytest

    from benchmarks import search_speed

    (workload,) = search_speed.gate_workloads()
    assert (Path(workload.model) / "config.json").is_file(), workload.model
    assert [label for label, _ in workload.budgets] == ["tight"]
    assert "benchmarks.search_speed --gate" in dry("bench") and "--gate" not in dry("bench", "QUICK=1")
    for argv, named in ((["--gate", "--only", "qwen2"], "--only"), (["--gate", "--budget", "tight"], "--budget"),
                        (["--gate", "--quick"], "--gate")):
        with pytest.raises(SystemExit) as exit_:
            search_speed.main(argv)
        assert exit_.value.code == 2 and named in capsys.readouterr().err.splitlines()[-1], argv
