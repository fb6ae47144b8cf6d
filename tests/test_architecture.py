"""The package's layering: no import cycle between plait's top-level packages, and a torch-free planner.

Every import counts, including those inside functions: a cycle hidden in a function body still
ties two packages together (neither can be read, tested or moved without the other).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import plait

ROOT = Path(plait.__file__).parent
# A model family compared by name, either way round; only models/spec.py, whence the features come, may.
FAMILY_COMPARISON = re.compile(r"\bfamily\s*[!=]=|[!=]=\s*[\w.]*\bfamily\b")
FAMILY_HOME = Path("models/spec.py")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top(module: str) -> str | None:
    """The top-level package or module of plait that ``module`` belongs to (None outside plait)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "plait" and len(parts) > 1 else None


def _imported(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    """Every plait module ``module`` imports, anywhere in its body, relative imports resolved."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + is_package]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # ``from plait import models`` imports the package models, not plait itself.
            names |= {f"{source}.{alias.name}" for alias in node.names} if source == "plait" else {source}
    return names


def package_graph() -> dict[str, dict[str, str]]:
    """For each top-level part of plait, the parts it imports, each with one file that does."""
    graph: dict[str, dict[str, str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        module = _module_name(path)
        source = _top(module)
        if source is None:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for name in _imported(tree, module, path.name == "__init__.py"):
            target = _top(name)
            if target is not None and target != source:
                graph.setdefault(source, {}).setdefault(target, str(path.relative_to(ROOT.parent)))
    return graph


def find_cycle(graph: dict[str, dict[str, str]]) -> list[str] | None:
    """One cycle of ``graph`` as its nodes in order (first repeated at the end), or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph.get(node, {})):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_between_top_level_packages():
    graph = package_graph()
    cycle = find_cycle(graph)
    if cycle is not None:
        edges = [f"{a} -> {b} ({graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
        raise AssertionError("import cycle between plait's packages:\n  " + "\n  ".join(edges))


def test_find_cycle_reports_the_cycle():
    graph = {"a": {"b": "a.py"}, "b": {"c": "b.py"}, "c": {"a": "c.py"}, "d": {"a": "d.py"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": "a.py"}, "b": {}}) is None


def test_planner_loads_no_torch():
    code = ("import sys, plait.plan.search, plait.plan.simulate, plait.facts.validity; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", f"the planner imported torch: {loaded}"


def family_comparisons(root: Path) -> list[str]:
    """Each line of a source file under ``root``, save models/spec.py, that compares a model family's name."""
    return [f"{path.relative_to(root)}:{number}: {line.strip()}"
            for path in sorted(root.rglob("*.py")) if path.relative_to(root) != FAMILY_HOME
            for number, line in enumerate(path.read_text().splitlines(), 1) if FAMILY_COMPARISON.search(line)]


def test_only_the_spec_compares_model_families():
    """Code reads the feature it depends on (spec.norm_kind, spec.rotary_positions, ...), not the family's name."""
    found = family_comparisons(ROOT)
    assert not found, "read a ModelSpec feature instead of comparing the family:\n  " + "\n  ".join(found)


def test_family_comparisons_are_found(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "spec.py").write_text('gpt2 = family == "gpt2"\n')
    (tmp_path / "cost.py").write_text('if spec.family != "llama":\n    pass\nfamily_name = 1\nx = "gpt2"==spec.family\n')
    assert family_comparisons(tmp_path) == ['cost.py:1: if spec.family != "llama":', 'cost.py:4: x = "gpt2"==spec.family']
