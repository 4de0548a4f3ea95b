"""Issue 58: a candidate's field that says how a step runs is read in few modules, each asking for what the field
means (``memory_model.activation_policy``, ``Candidate.optimizer_offload``, ``Candidate.named_engine``) instead of
reading it where the answer is needed. A field read in many modules is a meaning spelled in many places: a rung that
changes it (another engine, another way to keep activations) has to find every one.

A read counts where the code takes the attribute of something (``candidate.offload``, ``c.liger``); not an object's
own attribute (``self.offload``: the candidate's own properties, or another class's field of the same name), nor the
attribute of an owner that is not a candidate (``NOT_A_CANDIDATE``)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "autofit"
DECLARED = "core/_candidate_fields.py"
FIELDS = ("checkpointing", "liger", "activation_offload", "offload")
MAX_MODULES = 4
# Owners of the same attribute names that are not candidates: launch's engine and accelerate's FSDP plugin (their
# activation checkpointing), an algorithm's unit (whether Liger applies to it).
NOT_A_CANDIDATE = {"self", "engine", "plugin", "unit"}


def _owner(node: ast.Attribute) -> str:
    value = node.value
    if isinstance(value, ast.Name):
        return value.id
    return value.attr if isinstance(value, ast.Attribute) else ""


def readers(field: str, package: Path = PACKAGE) -> list:
    """The modules under ``package`` that read ``field`` off a candidate."""
    found = []
    for path in sorted(package.rglob("*.py")):
        name = str(path.relative_to(package))
        if name == DECLARED:
            continue
        if any(isinstance(node, ast.Attribute) and node.attr == field and isinstance(node.ctx, ast.Load)
               and _owner(node) not in NOT_A_CANDIDATE for node in ast.walk(ast.parse(path.read_text()))):
            found.append(name)
    return found


def test_the_rule_counts_reads_not_stores_nor_others_fields(tmp_path):
    (tmp_path / "a.py").write_text("def f(candidate):\n    return candidate.offload\n")
    (tmp_path / "b.py").write_text("def f(c):\n    return c.liger or c.checkpointing\n")
    (tmp_path / "c.py").write_text("class A:\n    def f(self, candidate):\n        self.offload = 1\n"
                                   "        return self.offload, engine.checkpointing, candidate.unit.liger\n")
    (tmp_path / "d.py").write_text("def f(self):\n    return self.candidate.offload, offload(offload=1)\n")
    assert readers("offload", tmp_path) == ["a.py", "d.py"]
    assert readers("liger", tmp_path) == ["b.py"] and readers("checkpointing", tmp_path) == ["b.py"]


@pytest.mark.parametrize("field", FIELDS)
def test_each_field_is_read_in_few_modules(field):
    found = readers(field)
    assert found, f"the rule finds no reader of {field}: it no longer sees the reads"
    assert len(found) <= MAX_MODULES, (
        f"Candidate.{field} is read in {len(found)} modules ({', '.join(found)}): ask what it means instead "
        f"(memory_model.activation_policy, Candidate.optimizer_offload, Candidate.named_engine)")
