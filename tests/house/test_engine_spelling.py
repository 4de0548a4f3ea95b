"""Issue 58, item 3: the engines (DeepSpeed ZeRO, FSDP2, plain data parallel) are declared once, in their registry
(``autofit/core/_engines.py``), as algorithms and cards are; every other module asks it (``ENGINES[name]``,
``engine.shards_parameters``, ``engine_for``) instead of spelling a name. A name elsewhere is a second declaration
that drifts: an engine added to the registry and missed by the module that branches on the old names.

A name counts as spelled where it is a string literal of the code (a docstring's or a comment's words do not), and so
do the two pieces the names were built from: "zero" (``f"zero{stage}"``, ``startswith("zero")``) and "-offload"."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "autofit"
REGISTRY = "core/_engines.py"
NAMES = {"ddp", "zero1", "zero2", "zero3", "zero2-offload", "zero3-offload", "fsdp2", "fsdp2-offload"}
PIECES = {"zero", "-offload"}


def _docstrings(tree: ast.AST) -> set:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body and \
                isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            found.add(id(node.body[0].value))
    return found


def spelled(path: Path) -> list:
    """The engine names (and pieces of them) ``path`` spells as string literals, with their lines."""
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    return sorted(f"{node.lineno}: {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                  and (node.value in NAMES or node.value in PIECES))


def test_engine_names_are_spelled_in_the_registry_only():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        if name != REGISTRY and spelled(path):
            found[name] = spelled(path)
    assert not found, f"engine names spelled outside {REGISTRY} (ask the registry instead): {found}"


def test_the_registry_declares_every_engine():
    from autofit.core import ENGINES

    assert set(ENGINES) == NAMES
    assert spelled(PACKAGE / REGISTRY)
