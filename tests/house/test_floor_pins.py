"""The floor lane installs exactly the declared floors of transformers, trl and optuna (``make test-floor``), read from
pyproject.toml: a requirement with a ceiling too (``transformers>=4.56.2,<5.25``) gives its floor alone, or the
shell splits the pin at the ``<`` and the lane never installs."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_floor_lane_pins_each_declared_floor_and_nothing_else():
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    recipe = subprocess.run(["make", "-n", "-B", ".venv-floor/.installed"], cwd=REPO, capture_output=True, text=True,
                            timeout=60).stdout
    install = next(line for line in recipe.splitlines() if "pip install -q -e" in line)
    declared = re.findall(r'^\s*"(transformers|trl|optuna)>=([^,"]+)', (REPO / "pyproject.toml").read_text(), re.M)
    expected = [f"{name}=={floor}" for name, floor in declared]
    assert len(expected) == 3
    assert install.split("'.[test]'", 1)[1].split() == expected, install
