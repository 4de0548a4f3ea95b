"""``autofit skills install``: autofit's agent skill (a ``SKILL.md`` shipped in the package, ``autofit/skills/``) copied
where a coding agent reads skills, in the form ``trl skills install`` uses: ``--target`` an agent's name (its skills
folder, ``--scope global`` under the home folder or ``project`` under this one) or a folder, and the skill lands in
``TARGET/autofit/SKILL.md``. A bad target is one line naming it and what is accepted, exit 2; an installed skill that
differs from this autofit's is replaced only with ``--force``."""

from __future__ import annotations

import argparse
import os
import sys
from importlib import resources
from pathlib import Path
from typing import Dict, Tuple

from autofit.cli._exit import EXIT_BAD_INPUT, EXIT_OK

SKILL = "autofit"
# Where each agent reads skills: (global, project), as TRL's installer lists them (trl/skills/agents.py)
AGENTS: Dict[str, Tuple[str, str]] = {
    "claude": ("~/.claude/skills", ".claude/skills"),
    "codex": ("~/.codex/skills", ".codex/skills"),
    "opencode": ("~/.config/opencode/skills", ".opencode/skills"),
}
DEFAULT_AGENT = "claude"


class TargetError(Exception):
    """The target cannot take the skill: one line."""


def skill_text() -> str:
    """The SKILL.md this autofit ships."""
    return resources.files("autofit").joinpath("skills", SKILL, "SKILL.md").read_text(encoding="utf-8")


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "skills", help="install autofit's agent skill (SKILL.md) where coding agents read skills",
        description="autofit's skill for coding agents: when to call autofit estimate, autofit search and trl <algo> "
                    "--config best.yaml, and how to read their --json documents.")
    commands = parser.add_subparsers(dest="skills_command", metavar="install|show", required=True,
                                     parser_class=type(parser))
    install = commands.add_parser("install", help="copy the skill to TARGET/autofit/SKILL.md",
                                  description="Copy autofit's SKILL.md to an agent's skills folder, or a folder.")
    install.add_argument("--target", default=DEFAULT_AGENT, metavar="AGENT_OR_DIR",
                         help=f"an agent ({', '.join(AGENTS)}; default {DEFAULT_AGENT}) or a folder of skills")
    install.add_argument("--scope", choices=("global", "project"), default="global",
                         help="for an agent: its skills folder under your home folder (global, default) or under this "
                              "folder (project)")
    install.add_argument("--force", action="store_true", help="replace an installed autofit skill that differs")
    commands.add_parser("show", help="print the SKILL.md on stdout")
    return parser


def skills_folder(target: str, scope: str) -> Path:
    """The folder the skill's own folder goes in; ``TargetError`` for a target that cannot be one."""
    if target in AGENTS:
        home, project = AGENTS[target]
        return Path(home if scope == "global" else project).expanduser().absolute()
    path = Path(target).expanduser()
    looks_like_path = os.sep in target or target.startswith((".", "~"))
    if path.exists() and not path.is_dir():
        raise TargetError(f"--target {target!r} is a file, not a folder: give an agent ({', '.join(AGENTS)}) or a "
                          "folder of skills")
    if not path.exists() and not looks_like_path:  # a misspelt agent would otherwise become a folder here
        raise TargetError(f"--target {target!r} is neither an agent autofit knows ({', '.join(AGENTS)}) nor an "
                          f"existing folder: give one of those, or a path (./{target}) to create it")
    return path.absolute()


def install(target: str, scope: str = "global", force: bool = False) -> Tuple[Path, bool]:
    """Write the skill; (its SKILL.md, whether it was written: False where the same skill is there already)."""
    from autofit.machine import atomic_write_text

    folder = skills_folder(target, scope) / SKILL
    path, text = folder / "SKILL.md", skill_text()
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise TargetError(f"{folder} is there and is not a folder: remove it, or give another --target")
    if path.is_file() and not path.is_symlink():
        if path.read_text(encoding="utf-8", errors="replace") == text:
            return path, False
        if not force:
            raise TargetError(f"{path} is there and differs from this autofit's skill: --force replaces it")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
    except OSError as exc:
        raise TargetError(f"cannot write {exc.filename or path}: {exc.strerror or exc}: give a --target you can "
                          "write to") from exc
    return path, True


def run(args: argparse.Namespace) -> int:
    if args.skills_command == "show":
        print(skill_text(), end="")
        return EXIT_OK
    try:
        path, written = install(args.target, args.scope, args.force)
    except TargetError as exc:
        print(f"autofit: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"{'installed' if written else 'already installed'}: {path}")
    return EXIT_OK
