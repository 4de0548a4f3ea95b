"""An algorithm is one unit (issue 38, item 2): one registry entry (``autofit.core._algorithms``) that the stages read,
and its factory in ``autofit.probe.algos``; no other module spells its name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from autofit.core import ALGORITHMS, DEFAULT_ALGO, Candidate, algorithm, algorithm_names
from autofit.core._algorithms import PARTS

PACKAGE = Path(__file__).resolve().parents[2] / "autofit"
MOST_MODULES = 3  # the registry among them


def test_outside_the_factories_at_most_three_modules_spell_an_algorithm_name():
    names = "|".join(map(re.escape, ALGORITHMS))
    quoted = re.compile(rf"""["']({names})["']""")
    spelling = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                      if "algos" not in path.parts and quoted.search(path.read_text(encoding="utf-8")))
    assert "core/_algorithms.py" in spelling
    assert len(spelling) <= MOST_MODULES, spelling


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_each_entry_names_a_factory_that_exists(name):
    module, function = ALGORITHMS[name].factory.split(":")
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert function in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_the_capabilities_the_rungs_and_options_read():
    assert DEFAULT_ALGO in ALGORITHMS and algorithm_names(rl=True) == ("grpo", "rloo", "ppo")
    assert algorithm_names(groups=True) == ("grpo", "rloo")
    assert algorithm_names(activation_offloading=True) == ("sft", "reward", "dpo", "kto")
    assert algorithm_names(precompute_ref=True) == ("dpo", "kto")
    assert "ppo" not in algorithm_names(liger=True) + algorithm_names(engine_offload=True)
    assert algorithm_names(trl_command=None) == ("ppo",)  # TRL 1.13 removed it, with its command
    assert algorithm_names(estimated=True) == tuple(ALGORITHMS)  # PPO's ledger too
    assert Candidate("ppo", "m", "cpu", 1, 1, 8).training_args()["response_length"] == 8


def test_a_name_the_registry_does_not_know_is_a_plain_causal_lm():
    mine = algorithm("my-trainer")
    assert mine.name == "my-trainer" and not mine.rl and mine.length_field == "max_length"
    assert not (mine.liger or mine.activation_offloading or mine.engine_offload or mine.sequence_classifier)
    assert Candidate("my-trainer", "m", "cpu", 1, 1, 8).training_args()["max_length"] == 8


def test_ppo_critic_is_a_part_not_an_algorithm_users_pick():
    critic = algorithm(ALGORITHMS["ppo"].critic)
    assert critic.sequence_classifier and critic.name in PARTS and critic.name not in ALGORITHMS
