"""The package's layering, read from the source (every import, function-level ones included):

    core  <  heads  <  drafters  <  bench  <  training        analysis reads results only

- ``eagle2.core`` (the round) imports no drafter, head or harness module;
- ``eagle2.heads`` imports ``core`` only; ``eagle2.drafters`` imports ``core`` and ``heads`` only;
- ``eagle2.bench`` imports nothing from ``training``;
- ``analysis`` reaches no engine code: of ``eagle2`` it imports only the results store's modules, and
  those import no torch-side layer;
- no import cycle among the modules of ``eagle2``, ``analysis`` and ``experiments``;
- every module says its job in a docstring and stays short enough to read in one sitting.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("eagle2", "analysis", "experiments")
ALLOWED = {  # layer -> the eagle2 layers it may import
    "eagle2.core": {"eagle2.core"},
    "eagle2.heads": {"eagle2.core", "eagle2.heads"},
    "eagle2.drafters": {"eagle2.core", "eagle2.heads", "eagle2.drafters"},
    "eagle2.bench": {"eagle2.core", "eagle2.heads", "eagle2.drafters", "eagle2.bench", "analysis"},
}
ANALYSIS_MAY_READ = {"eagle2.bench.results", "eagle2.bench.methods", "eagle2.bench.row_schema",
                     "eagle2.core.cpu"}  # the store hashes dtype=auto as this CPU resolves it (no torch)
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The project modules ``path`` imports anywhere in its body (``from pkg import mod`` counts as mod)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in known}
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(path, set(modules)) - {name} for name, path in modules.items()}


def layer_of(module: str) -> str:
    return ".".join(module.split(".")[:2]) if module.startswith("eagle2.") else module.split(".")[0]


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, deps in graph.items():
        allowed = ALLOWED.get(layer_of(module))
        if allowed is not None:
            bad += [f"{module} -> {d}" for d in deps if layer_of(d) not in allowed and d != "eagle2"]
        if module.startswith("analysis"):
            bad += [f"{module} -> {d}" for d in deps if d.startswith("eagle2") and d not in ANALYSIS_MAY_READ]
    for module in ANALYSIS_MAY_READ:  # what analysis reads must not pull the engine in behind it
        bad += [f"{module} -> {d}" for d in graph.get(module, ()) if d not in ANALYSIS_MAY_READ]
    return sorted(bad)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_layers_import_only_the_layers_below():
    assert layering_violations(import_graph()) == []


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_checks_catch_a_violation_and_a_cycle():
    graph = import_graph()
    graph["eagle2.core.engine"] = graph["eagle2.core.engine"] | {"eagle2.drafters.eagle2_dynamic"}
    graph["analysis.metrics"] = graph["analysis.metrics"] | {"eagle2.core.tree"}
    graph["eagle2.bench.results"] = graph["eagle2.bench.results"] | {"eagle2.bench.runner"}
    assert layering_violations(graph) == ["analysis.metrics -> eagle2.core.tree",
                                          "eagle2.bench.results -> eagle2.bench.runner",
                                          "eagle2.core.engine -> eagle2.drafters.eagle2_dynamic"]
    graph = import_graph()  # the cycle this layout removed: the cost profile building EAGLE-2's drafter itself
    graph["eagle2.drafters.cost_profile"] = graph["eagle2.drafters.cost_profile"] | {"eagle2.drafters.eagle2_dynamic"}
    assert cycles(graph) == [["eagle2.drafters.cost_profile", "eagle2.drafters.eagle2_dynamic"]]


@pytest.mark.parametrize("module", sorted(project_modules()))
def test_module_has_a_docstring_and_stays_short(module):
    path = project_modules()[module]
    source = path.read_text()
    assert ast.get_docstring(ast.parse(source)), f"{path} has no module docstring"
    assert len(source.splitlines()) <= MAX_LINES, f"{path} has over {MAX_LINES} lines"
