"""Probes side by side through the door a user uses (issue 49): `autofit search --gpus-for-probes 0,1,2,3` on the
CPU, four simulated devices (each probe its own process, meter and budget), against the same search one probe at a
time. micro-batch 1x8 fits 143 MiB and 2x4 does not (tests/report): a question whose answer is memory's alone, so
the two searches must agree whatever the machine's load does to the timings."""

import json
from pathlib import Path

import pytest

from autofit import cli

pytestmark = pytest.mark.slow

SEARCH = ["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "143MiB", "--max-length", "64",
          "--verify-steps", "3", "--ladder", "micro-batch", "-q"]


def search(out: Path, *extra: str) -> dict:
    assert cli.main(SEARCH + ["--out", str(out), *extra]) == 0
    return json.loads((out / "best.json").read_text())


def probes(best: dict) -> list:
    return [(r["kind"], r["candidate"], r["outcome"], r["peak_bytes"]) for r in best["candidates"]]


def test_four_simulated_devices_find_the_serial_answer_in_fewer_rounds(tmp_path, capsys):
    serial = search(tmp_path / "serial")
    side_by_side = search(tmp_path / "slots", "--gpus-for-probes", "0,1,2,3")
    assert side_by_side["verified"]["candidate"] == serial["verified"]["candidate"] == "mb=1x8 len=64"
    assert probes(side_by_side) == probes(serial)  # the same probes, the same measured peaks
    used = side_by_side["side_by_side"]
    assert serial["side_by_side"] is None and used["devices"] == ["0", "1", "2", "3"]
    assert used["rounds"] < serial["probes_this_run"] == len(serial["candidates"])  # one probe a round, serially
    assert used["started"] >= side_by_side["probes_this_run"]
    assert f"side by side on 4 devices, {used['rounds']} rounds of probes" in capsys.readouterr().out


def test_a_pair_of_processes_needs_two_devices(tmp_path, capsys):
    assert cli.main(SEARCH + ["--out", str(tmp_path), "--gpus", "2", "--gpus-for-probes", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--gpus-for-probes 3 gives 1 device(s)" in err and "give at least 2" in err


@pytest.mark.parametrize("given, why", [("0,0", "distinct"), ("a,1", "distinct"), ("-1", "distinct")])
def test_bad_device_lists_are_one_line(tmp_path, capsys, given, why):
    assert cli.main(SEARCH + ["--out", str(tmp_path), "--gpus-for-probes", given]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and given in err and why in err
