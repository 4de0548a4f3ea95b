"""The house rules that a reader relies on: packages by process and stage, each layer importing only the layers
below it (deferred imports inside functions count too), the probe's child process reached only through the probe,
the search's process free of torch, no import circles (not even through imports for annotations), and no module so
long that it has more than one job."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "autofit"
MAX_LINES = 350
MAX_TOP_LEVEL = 13
# From the bottom up: a package may import the ones before it, never one after it.
LAYERS = ("core", "machine", "rungs", "memory_model", "probe", "workers", "launch", "search", "export", "report",
          "_api", "cli")
# Each layer's own place among LAYERS; memory_model and probe do not import each other, nor export and report.
PEERS = ({"memory_model", "probe"}, {"export", "report"})
HEAVY = ("torch", "transformers", "trl", "peft", "bitsandbytes", "accelerate", "datasets")
# The search's side of the house: importing any of them (and what they import) never loads HEAVY.
TORCH_FREE = ("autofit", "autofit._api", "autofit.core", "autofit.machine", "autofit.rungs", "autofit.memory_model",
              "autofit.launch", "autofit.search", "autofit.workers",
              "autofit.export", "autofit.report", "autofit.cli", "autofit.probe")


def modules():
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _type_only(tree: ast.AST) -> set:
    """The import statements under ``if TYPE_CHECKING:``: names for annotations, never run."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            found |= {id(child) for statement in node.body for child in ast.walk(statement)}
    return found


def _top_level(tree: ast.Module):
    """The module's own statements, and those under its top-level if/try blocks: what importing it runs."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, (ast.If, ast.Try)):
            todo += node.body + node.orelse + getattr(node, "finalbody", []) + \
                [s for h in getattr(node, "handlers", []) for s in h.body]


def imports(path: Path, name: str, known, typing: bool = True, deferred: bool = True) -> set:
    """The autofit modules ``name`` imports (inside functions too; ``deferred=False``: only what importing it runs);
    ``typing=False`` leaves out the imports made only for annotations."""
    tree = ast.parse(path.read_text())
    skipped = set() if typing else _type_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in (ast.walk(tree) if deferred else _top_level(tree)):
        if id(node) in skipped:
            continue
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
            # ``from package import submodule`` imports the submodule (and runs the package's face, which only
            # hands names on); ``from module import name`` imports the module
            targets = submodules if len(submodules) == len(node.names) else [base] + submodules
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph(typing: bool = True, deferred: bool = True):
    known = modules()
    return {name: imports(path, name, known, typing, deferred) for name, path in known.items()}


def layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "autofit"


def circles(edges) -> list:
    """Each import circle of ``edges`` (module -> the modules it imports), as ``a -> b -> a``."""
    found = []

    def visit(node, stack, on_stack, done):
        on_stack.add(node)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt in on_stack:
                found.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in done:
                visit(nxt, stack, on_stack, done)
        stack.pop()
        on_stack.discard(node)
        done.add(node)

    done = set()
    for node in sorted(edges):
        if node not in done:
            visit(node, [], set(), done)
    return found


def test_the_circle_rule_counts_imports_for_annotations_and_inside_functions(tmp_path):
    sources = {
        "pkg/__init__.py": "from pkg.a import A\n",
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\nclass A: ...\n",
        "pkg/b.py": "from pkg.a import A\nclass B: ...\n",
        "pkg/c.py": "def late():\n    from pkg.d import D\n",
        "pkg/d.py": "from pkg import c\nclass D: ...\n",
        "pkg/e.py": "import pkg\n",
    }
    for name, code in sources.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(code)
    known = {"pkg": tmp_path / "pkg/__init__.py", **{f"pkg.{m}": tmp_path / f"pkg/{m}.py" for m in "abcde"}}
    edges = {name: imports(path, name, known) for name, path in known.items()}
    assert circles(edges) == ["pkg.a -> pkg.b -> pkg.a", "pkg.c -> pkg.d -> pkg.c"]
    edges["pkg.a"].add("pkg")  # a package's module importing its own face closes a circle through the face
    assert "pkg -> pkg.a -> pkg" in circles(edges)


def test_no_import_circles():
    # every import counts: one inside a function, one made only for annotations (under TYPE_CHECKING: it never runs,
    # but the two modules still know each other), a package's module importing its own face
    found = circles(graph())
    assert not found, "import circles: " + "; ".join(found)


def test_every_module_is_in_a_layer_and_the_top_level_is_small():
    top = sorted(p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file())
    assert len(top) <= MAX_TOP_LEVEL, top
    assert {layer(name) for name in modules()} - {"autofit"} <= set(LAYERS)


def test_no_layer_imports_one_above_it():
    upward = []
    for name, targets in graph().items():
        here = layer(name)
        if here == "autofit":  # the package's face: lazy exports of the public names
            continue
        for target in targets:
            there = layer(target)
            if there == here or (there == "autofit" and here == "cli"):  # the command line's --version
                continue
            if there == "autofit" or LAYERS.index(there) > LAYERS.index(here) or \
                    any({here, there} <= peers for peers in PEERS):
                upward.append(f"{name} -> {target}")
    assert not upward, "imports that reach up (or across to a peer): " + "; ".join(sorted(upward))


def child_modules():
    """The modules of the probe's child process, by rule: the probe's private modules its facade does not load (the
    search's side of the probe is what importing ``autofit/probe/__init__.py`` runs; the runner names the child's
    entry point only when it starts a probe), and a rung's probe step beside it (``autofit.rungs.<rung>._probe*``).
    The kit and the built-in factories are public, for the user's own factories."""
    edges = graph(deferred=False)
    search_side, todo = set(), ["autofit.probe"]
    while todo:
        for target in edges.get(todo.pop(), ()):
            if target.startswith("autofit.probe.") and target not in search_side:
                search_side.add(target)
                todo.append(target)
    probe = {name for name in edges if name.startswith("autofit.probe._") and name not in search_side}
    steps = {name for name in edges
             if name.startswith("autofit.rungs.") and name.rsplit(".", 1)[-1].startswith("_probe")}
    return probe | steps


def test_the_child_modules_are_found_by_the_rule():
    child = child_modules()
    assert {"autofit.probe._worker", "autofit.probe._meters", "autofit.rungs.liger._probe",
            "autofit.rungs.engines._probe_fsdp", "autofit.rungs.activation_offload._probe"} <= child
    assert not child & {"autofit.probe._runner", "autofit.probe._factory", "autofit.probe.kit"}


def test_the_probes_child_modules_are_imported_only_by_the_child():
    child = child_modules()
    outside = [f"{name} -> {target}" for name, targets in graph().items()
               if not name.startswith("autofit.probe") and name not in child for target in targets & child]
    assert not outside, outside


def test_no_module_reaches_past_another_packages_facade():
    """A package's private modules (``_name``) are its own: another package imports what its ``__init__`` hands on
    (the probe's public ``kit`` and ``algos`` included), never ``autofit.probe._worker`` from the search."""
    reached = [f"{name} -> {target}" for name, targets in graph().items() for target in sorted(targets)
               if layer(target) != layer(name) and any(part.startswith("_") for part in target.split(".")[2:])]
    assert not reached, "imports past a package's facade: " + "; ".join(sorted(reached))


@pytest.fixture(scope="module")
def search_process_imports():
    """What importing the search's side (TORCH_FREE) loads, in a fresh interpreter: (HEAVY packages, modules of the
    probe's child)."""
    child = sorted(child_modules())
    code = (f"import importlib, sys\nfor name in {TORCH_FREE!r}:\n    importlib.import_module(name)\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
            f"print(sorted(m for m in {child!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    heavy, child_loaded = done.stdout.strip().splitlines()[-2:]
    return heavy, child_loaded


def test_the_search_side_imports_no_torch(search_process_imports):
    assert search_process_imports[0] == "[]"


def test_the_search_process_loads_none_of_the_childs_modules(search_process_imports):
    # the child's modules are the ones the child imports: the kit the export uses loads its virtual checkpoints only
    # where it writes one (a child process)
    assert search_process_imports[1] == "[]"


def test_the_public_api_is_what_autofit_exports():
    import autofit

    for name in autofit.__all__:
        assert getattr(autofit, name) is not None, name
    assert issubclass(autofit.FactoryError, autofit.InputError)


@pytest.mark.parametrize("name", sorted(modules()))
def test_modules_stay_small(name):
    lines = len(modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines: split it by job (the rule is 350)"
