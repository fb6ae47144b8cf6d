"""The package's layering: what each top-level part of plait may import, no import cycle between
them, a torch-free planner; and functions short enough to read, taking few parameters.

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

# What each top-level part of plait (a package or a module) may import, by part; a file's own entry
# (its path under src/plait) adds to its part's. Bottom up: the pure shared layers (errors, models,
# schedules, layout, facts, the hardware catalog), the torch-free planner (plan) beside config, the
# engine (topology, parallel, train) and observe above them, and the tools that use both (calibrate,
# explain, cli) on top.
# An import that goes the wrong way is either moved or listed here, on the file that makes it, as a
# known wrong-way edge to be removed; an entry that no import uses any more fails too.
ALLOWED_IMPORTS: dict[str, set[str]] = {
    "errors": set(),
    "version": set(),
    "token_range": set(),
    "paths": {"errors"},  # what a named path is (a file, a folder, a device), from os.stat alone
    "progress": set(),  # a rank's step, phase and operation, which the engine writes and the watchdog reads
    "models": {"errors"},
    "schedules": {"errors", "models"},  # the stage split balances the model's FLOPs
    "layout": {"errors", "schedules"},  # a schedule's name and needs are read from its registry
    "facts": {"errors", "layout", "models", "schedules"},
    # the accelerators' vendor figures and measured profiles: what the planner predicts on and the
    # engine's summary reads a GPU's peak from
    "hardware": {"errors", "facts", "layout", "paths"},
    "tokenizer": {"errors", "paths", "token_range"},
    "interop": {"errors", "models", "tokenizer"},  # the export copies the run's tokenizer files
    "config": {"errors", "facts", "interop", "layout", "models", "paths"},  # --init-from's model from its config.json
    "plan": {"errors", "facts", "hardware", "layout", "models", "schedules"},
    "topology": {"layout"},
    "sample": {"errors", "models", "tokenizer"},
    "observe": {"config", "errors", "facts", "hardware", "layout", "models", "schedules", "topology"},
    "parallel": {"facts", "layout", "models", "progress", "schedules", "topology"},
    "train": {"config", "errors", "facts", "interop", "layout", "models", "observe", "parallel", "paths", "progress",
              "token_range", "tokenizer", "topology", "version"},  # facts: the learning-rate schedules' shapes
    # calibrate times plait's own layers and step (parallel, train) into the planner's hardware profile
    "calibrate": {"config", "errors", "facts", "hardware", "layout", "models", "parallel", "plan", "topology",
                  "train"},
    # explain sets what a run measured (observe) beside the planner's prediction of it (plan)
    "explain": {"errors", "facts", "hardware", "layout", "models", "observe", "paths", "plan", "schedules"},
    "cli": {"calibrate", "config", "errors", "explain", "facts", "hardware", "interop", "layout", "models", "observe",
            "paths", "plan", "sample", "schedules", "tokenizer", "train", "version"},
    "__main__": {"cli"},
}


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top(module: str, package: str) -> str | None:
    """The top-level part (package or module) of ``package`` that ``module`` belongs to (None outside it)."""
    parts = module.split(".")
    return parts[1] if parts[0] == package and len(parts) > 1 else None


def _imported(tree: ast.Module, module: str, is_package: bool, package: str) -> set[str]:
    """Every module ``module`` imports, anywhere in its body, relative imports resolved."""
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
            names |= {f"{source}.{alias.name}" for alias in node.names} if source == package else {source}
    return names


def import_edges(root: Path = ROOT) -> set[tuple[str, str]]:
    """Each (file, part) where the file (its path under ``root``) imports another top-level part of ``root``."""
    edges = set()
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root)
        source = _top(module, root.name)
        if source is None:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for name in _imported(tree, module, path.name == "__init__.py", root.name):
            target = _top(name, root.name)
            if target is not None and target != source:
                edges.add((path.relative_to(root).as_posix(), target))
    return edges


def package_graph(root: Path = ROOT) -> dict[str, dict[str, str]]:
    """For each top-level part of plait, the parts it imports, each with one file that does."""
    graph: dict[str, dict[str, str]] = {}
    for file, target in sorted(import_edges(root)):
        graph.setdefault(_part(file), {}).setdefault(target, f"{root.name}/{file}")
    return graph


def _part(file: str) -> str:
    """The top-level part a file (its path under the package) belongs to."""
    return file.split("/")[0].removesuffix(".py")


def import_problems(root: Path, allowed: dict[str, set[str]]) -> list[str]:
    """Every import under ``root`` that ``allowed`` does not list, every part it lacks, and every
    entry of it that no import uses, each as a sentence that says how to fix it."""
    parts = {_part(path.relative_to(root).as_posix()) for path in root.rglob("*.py")} - {"__init__"}
    problems = [f"{part} is not in the table of allowed imports: add it with the parts it may import"
                for part in sorted(parts - set(allowed))]
    used = set()
    for file, target in sorted(import_edges(root)):
        part = _part(file)
        key = file if target in allowed.get(file, ()) else part
        if target in allowed.get(key, ()):
            used.add((key, target))
        else:
            problems.append(f"{root.name}/{file} imports {target}, which {part} may not import: if {part} rightly "
                            f"depends on {target}, add the edge to the table of allowed imports; if not, import the "
                            f"other way (move what it needs into {part} or below both)")
    problems += [f"the table names {key}, which {root.name} no longer has: take it out of the table"
                 for key in sorted(allowed) if key not in parts and not (root / key).is_file()]
    problems += [f"the table lets {key} import {target}, but no import there does any more: take it out of the table"
                 for key in sorted(allowed) for target in sorted(allowed[key]) if (key, target) not in used]
    return problems


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


def test_imports_follow_the_table():
    problems = import_problems(ROOT, ALLOWED_IMPORTS)
    assert not problems, "imports outside tests/test_architecture.py's ALLOWED_IMPORTS:\n  " + "\n  ".join(problems)


def test_import_problems_are_reported(tmp_path):
    root = tmp_path / "plait"
    (root / "plan").mkdir(parents=True)
    (root / "train").mkdir()
    (root / "__init__.py").write_text("")
    (root / "errors.py").write_text("")
    (root / "layout.py").write_text("from plait.errors import ConfigError\n")
    (root / "plan" / "__init__.py").write_text("")
    (root / "plan" / "hardware.py").write_text("from ..layout import Layout\n")
    (root / "train" / "__init__.py").write_text("")
    (root / "train" / "launch.py").write_text("def f():\n    from plait.plan import hardware\n")
    (root / "extra.py").write_text("import plait.errors\n")
    allowed = {"errors": set(), "layout": {"errors"}, "plan": {"layout"}, "train": {"layout"},
               "train/launch.py": {"errors"}, "observe": set()}
    assert import_problems(root, allowed) == [
        "extra is not in the table of allowed imports: add it with the parts it may import",
        "plait/extra.py imports errors, which extra may not import: if extra rightly depends on errors, add the "
        "edge to the table of allowed imports; if not, import the other way (move what it needs into extra or "
        "below both)",
        "plait/train/launch.py imports plan, which train may not import: if train rightly depends on plan, add the "
        "edge to the table of allowed imports; if not, import the other way (move what it needs into train or "
        "below both)",
        "the table names observe, which plait no longer has: take it out of the table",
        "the table lets train import layout, but no import there does any more: take it out of the table",
        "the table lets train/launch.py import errors, but no import there does any more: take it out of the table",
    ]
    allowed = {"errors": set(), "layout": {"errors"}, "plan": {"layout"}, "train": {"plan"}, "train/launch.py": set(),
               "extra": {"errors"}}
    assert import_problems(root, allowed) == []


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


MAX_FUNCTION_LINES = 80
MAX_PARAMETERS = 7
# A comment on the line above a function that takes more parameters says why, and begins so.
WHY_MORE_PARAMETERS = re.compile(r"#\s*\((eight|nine|ten|\d+) parameters:")


def oversized_functions(root: Path) -> list[str]:
    """Functions under ``root`` longer than ``MAX_FUNCTION_LINES`` lines, or taking more than
    ``MAX_PARAMETERS`` parameters (``self``, ``cls`` and autograd's ``ctx`` not counted) without a
    ``WHY_MORE_PARAMETERS`` comment on the line above."""
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            where = f"{path.relative_to(root)}:{node.lineno}: {node.name}"
            if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                found.append(f"{where} is {node.end_lineno - node.lineno + 1} lines long")
            args = node.args
            named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
            count = len(named) + (args.vararg is not None) + (args.kwarg is not None)
            count -= bool(named) and named[0].arg in ("self", "cls", "ctx")
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if count > MAX_PARAMETERS and not WHY_MORE_PARAMETERS.search(lines[first - 2] if first > 1 else ""):
                found.append(f"{where} takes {count} parameters")
    return found


def test_functions_are_short_and_take_few_parameters():
    found = oversized_functions(ROOT)
    assert not found, ("split these, or pass a frozen object of what belongs together (a comment "
                       "'# (N parameters: why)' above a function says why it takes more):\n  " + "\n  ".join(found))


def test_oversized_functions_are_found(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "code.py").write_text(
        f"def long():\n{body}\n\ndef wide(self, a, b, c, d, e, f, g, h):\n    pass\n\n"
        "# (eight parameters: a kernel's tensors)\ndef kernel(a, b, c, d, e, f, g, h):\n    pass\n\n"
        "def seven(self, a, b, c, d, e, f, g):\n    pass\n")
    assert oversized_functions(tmp_path) == [f"code.py:1: long is {MAX_FUNCTION_LINES + 1} lines long",
                                             f"code.py:{MAX_FUNCTION_LINES + 4}: wide takes 8 parameters"]
