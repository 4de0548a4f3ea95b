"""The house rules that a reader relies on: no import circles between autofit's modules (deferred imports inside
functions count too), and no module so long that it has more than one job."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("autofit",)
MAX_LINES = 420


def modules():
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(path: Path, name: str, known) -> set:
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def test_no_import_circles():
    known = modules()
    graph = {name: imports(path, name, known) for name, path in known.items()}
    # a package's __init__ importing its own submodules is how packages expose their API, not a circle
    graph = {name: {t for t in targets if not t.startswith(name + ".")} for name, targets in graph.items()}
    cycles = []

    def visit(node, stack, on_stack, done):
        on_stack.add(node)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_stack:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, stack, on_stack, done)
        stack.pop()
        on_stack.discard(node)
        done.add(node)

    done = set()
    for node in sorted(graph):
        if node not in done:
            visit(node, [], set(), done)
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("name", sorted(modules()))
def test_modules_stay_small(name):
    lines = len(modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines: split it by job (the rule is about 400)"
