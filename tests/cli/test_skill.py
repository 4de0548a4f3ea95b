"""autofit's agent skill (issue 61, item 5): a SKILL.md in the form TRL's ``trl skills install`` uses, shipped as
package data and installed by ``autofit skills install``; a bad target is one line, exit 2. The skill's own commands
("Check that it works here") run as written, on tiny-qwen2 on the CPU under a simulated budget, and their JSON says
what the skill says: the files it names exist and the next command is the skill's."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
import yaml

from autofit.cli._skills import AGENTS, SKILL, skill_text

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "autofit" / "skills" / SKILL / "SKILL.md"


def autofit(*argv: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "autofit.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          check=False, env=environment)


def installed(tmp_path: Path) -> Path:
    done = autofit("skills", "install", "--target", str(tmp_path / "skills"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    path = tmp_path / "skills" / SKILL / "SKILL.md"
    assert done.stdout == f"installed: {path}\n"
    return path


def front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n", 2)[1])


def test_the_installed_skill_is_the_shipped_one_in_trls_form(tmp_path):
    path = installed(tmp_path)
    text = path.read_text()
    assert text == SHIPPED.read_text() == skill_text()
    meta = front_matter(text)
    assert meta["name"] == path.parent.name == SKILL  # the folder is the skill's name, as TRL installs trl-training
    assert "autofit estimate" in meta["description"] or "estimate" in meta["description"]
    assert meta["metadata"]["commands"] == ["autofit estimate", "autofit search", "autofit skills install"]
    for code in ("0", "2", "3", "4", "130", "143"):  # every exit code has its row
        assert re.search(rf"^\| {code} \|", text, flags=re.M), code


def test_the_wheel_ships_the_skill():
    """pyproject's package data names the SKILL.md (setuptools copies what these globs match into the wheel; tomllib
    is not in Python 3.10, so the one line is read as written)."""
    line = re.search(r"^\[tool\.setuptools\.package-data\]\nautofit = (\[.*\])$", (REPO / "pyproject.toml").read_text(),
                     flags=re.M)
    assert line is not None
    data = json.loads(line.group(1))
    assert any(fnmatch.fnmatch(str(SHIPPED.relative_to(REPO / "autofit")), glob) for glob in data)


def test_the_default_target_is_where_the_agent_reads_skills(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    done = autofit("skills", "install", cwd=tmp_path, env={"HOME": str(home)})
    assert done.returncode == 0, done.stderr
    assert (home / ".claude" / "skills" / SKILL / "SKILL.md").read_text() == skill_text()
    done = autofit("skills", "install", "--target", "codex", "--scope", "project", cwd=tmp_path,
                   env={"HOME": str(home)})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / AGENTS["codex"][1] / SKILL / "SKILL.md").is_file()
    again = autofit("skills", "install", cwd=tmp_path, env={"HOME": str(home)})
    assert again.returncode == 0 and again.stdout.startswith("already installed: ")


@pytest.mark.parametrize("case", ["file", "misspelt-agent", "differs", "unwritable"])
def test_a_bad_target_is_one_line_and_exit_2(tmp_path, case):
    target = tmp_path / "skills"
    if case == "file":
        target.write_text("not a folder")
        argv, words = ["--target", str(target)], "is a file, not a folder"
    elif case == "misspelt-agent":
        argv, words = ["--target", "claud"], "neither an agent autofit knows (claude, codex, opencode)"
    elif case == "differs":
        (target / SKILL).mkdir(parents=True)
        (target / SKILL / "SKILL.md").write_text("someone's own skill\n")
        argv, words = ["--target", str(target)], "differs from this autofit's skill: --force replaces it"
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes anywhere")
        target.mkdir()
        target.chmod(0o500)
        argv, words = ["--target", str(target)], "cannot write"
    done = autofit("skills", "install", *argv, cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith("autofit: error: ") and done.stderr.count("\n") == 1 and words in done.stderr
    assert done.stdout == ""
    if case == "differs":
        assert (target / SKILL / "SKILL.md").read_text() == "someone's own skill\n"
        forced = autofit("skills", "install", *argv, "--force", cwd=tmp_path)
        assert forced.returncode == 0 and (target / SKILL / "SKILL.md").read_text() == skill_text()
    assert not (tmp_path / "claud").exists()


def section(text: str, heading: str) -> str:
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def skill_commands(text: str) -> List[List[str]]:
    """The commands of the skill's "Check that it works here" block, as written."""
    block = re.search(r"```bash\n(.*?)```", section(text, "Check that it works here"), flags=re.S)
    assert block is not None
    return [shlex.split(line) for line in block.group(1).splitlines() if line.strip()]


@pytest.mark.slow
def test_the_skills_commands_run_as_written_and_their_json_says_what_the_skill_says(tmp_path):
    text = installed(tmp_path).read_text()
    commands = skill_commands(text)
    assert [words[:2] for words in commands] == [["autofit", "estimate"], ["autofit", "search"]]
    documents = []
    for words in commands:
        done = autofit(*words[1:], cwd=tmp_path)
        document = json.loads(done.stdout)  # the one document, nothing else on stdout
        assert done.returncode == document["exit"]["code"] == 0, done.stderr
        documents.append(document)
    estimate, search = documents
    assert estimate["command"] == "estimate" and estimate["exit"]["reason"] == "estimated"
    assert estimate["estimates"][0]["answer"]["fits"]
    assert search["command"] == "search" and search["exit"]["reason"] == "fits" and search["fits"]
    out = tmp_path / commands[1][commands[1].index("--out") + 1]
    files = search["files"]
    assert files["out_dir"] == str(out.resolve())
    for key, name in (("best_yaml", "best.yaml"), ("best_json", "best.json"), ("report_html", "report.html")):
        assert files[key] == str(out.resolve() / name) and Path(files[key]).is_file()
    # the next command is the one the skill says, with the folder's absolute path
    said = re.search(r"its `\.next\.train` is:\n\n```\n(.*?)\n```", section(text, "Check that it works here"),
                     flags=re.S)
    assert said is not None
    expected = shlex.split(said.group(1))
    config = expected.index("--config") + 1
    expected[config] = str((tmp_path / expected[config]).resolve())
    assert shlex.split(search["next"]["train"]) == expected
    assert search["next"]["placeholders"] == ["YOUR_DATASET"]
    best = json.loads(Path(files["best_json"]).read_text())
    assert best["train_command"] == search["next"]["train"] and best["rungs"] == search["answer"]["rungs"]
    assert search["answer"]["peak"]["bytes"] <= search["question"]["budget"]["bytes"]
    trained = yaml.safe_load(Path(files["best_yaml"]).read_text())
    assert {key: trained[key] for key in search["answer"]["settings"]} == search["answer"]["settings"]


def test_skills_without_a_subcommand_names_the_accepted_ones_in_one_line(tmp_path):
    done = autofit("skills", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == "autofit: error: the following arguments are required: install|show (see autofit skills " \
                          "--help)\n"
    shown = autofit("skills", "show", cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout == skill_text()
