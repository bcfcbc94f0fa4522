"""The package's layering, read from the source (every import, function-level ones included):

    registry  <  core  <  heads  <  drafters  <  bench  <  training    results, prompts: below bench and training
                                                                       analysis: reads results only

- ``eagle2.registry`` (``conf/`` read as the registry of methods and benchmarks) imports nothing of the project;
- ``eagle2.core`` (the round) imports no drafter, head or harness module;
- ``eagle2.heads`` imports ``core`` only; ``eagle2.drafters`` imports ``core`` and ``heads`` only;
- ``eagle2.results`` (store, row schema, throughput, frames) imports only itself and ``core.cpu``
  (no torch-side layer) and the registry, ``eagle2.prompts`` (chat templates, questions) only itself and
  the registry;
- ``eagle2.bench`` imports nothing from ``training`` or ``analysis``; ``eagle2.training`` nothing from
  ``bench`` or ``analysis``;
- ``analysis`` reaches no engine code: of ``eagle2`` it imports only ``eagle2.results``, the registry (and
  ``core.cpu``);
- the command lines (``eagle2.identity``, ``experiments``) sit on top: they may import any layer but
  ``experiments`` (the identity command imports no ``analysis`` either), and nothing imports them;
- every module falls under one of these rules;
- no import cycle among the modules of ``eagle2``, ``analysis`` and ``experiments``;
- in ``eagle2.training``, the data side of the pipeline (``corpora``, ``shards``, ``features``, ``data``) imports
  nothing of the training side (``objectives``, ``loop``, ``evaluation``, ``recipe``): no import against the flow;
- every module says its job in a docstring and stays short enough to read in one sitting.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("eagle2", "analysis", "experiments")
BELOW_HARNESS = {"eagle2.registry", "eagle2.core", "eagle2.heads", "eagle2.drafters", "eagle2.results",
                 "eagle2.prompts"}
ALLOWED = {  # layer -> the layers it may import
    "eagle2": set(),  # the package's docstring
    "eagle2.registry": set(),
    "eagle2.core": {"eagle2.core"},
    "eagle2.heads": {"eagle2.core", "eagle2.heads"},
    "eagle2.drafters": {"eagle2.core", "eagle2.heads", "eagle2.drafters"},
    "eagle2.prompts": {"eagle2.prompts", "eagle2.registry"},
    "eagle2.results": {"eagle2.results", "eagle2.registry", "eagle2.core"},  # core: cpu only (LIGHT, below)
    "eagle2.bench": BELOW_HARNESS | {"eagle2.bench"},
    "eagle2.training": BELOW_HARNESS | {"eagle2.training"},
    "eagle2.identity": BELOW_HARNESS | {"eagle2.bench"},
    "analysis": {"analysis", "eagle2.results", "eagle2.registry", "eagle2.core"},  # core: cpu only (LIGHT)
    "experiments": BELOW_HARNESS | {"eagle2.bench", "eagle2.training", "analysis", "experiments"},
}
LIGHT = ("eagle2.results", "eagle2.registry", "eagle2.core.cpu")  # the store hashes dtype=auto as this CPU
# resolves it (no torch)
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
        if allowed is None:
            bad.append(f"{module}: no layering rule")
            continue
        bad += [f"{module} -> {d}" for d in deps if layer_of(d) not in allowed and d != "eagle2"]
        if module.startswith("analysis") or module.startswith("eagle2.results"):
            # analysis, and the results layer it reads, must not pull the engine or the harness in
            bad += [f"{module} -> {d}" for d in deps if d.startswith("eagle2") and not d.startswith(LIGHT)]
    return sorted(set(bad))


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


DATA_SIDE = tuple(f"eagle2.training.{m}" for m in ("corpora", "shards", "features", "data"))
TRAINING_SIDE = tuple(f"eagle2.training.{m}" for m in ("objectives", "loop", "evaluation", "recipe"))


def against_the_flow(graph: dict[str, set[str]]) -> list[str]:
    """The imports of the training pipeline's data side that reach its training side."""
    return sorted(f"{m} -> {d}" for m, deps in graph.items() if m.startswith(DATA_SIDE)
                  for d in deps if d.startswith(TRAINING_SIDE))


def test_the_training_pipeline_imports_nothing_against_its_flow():
    graph = import_graph()
    assert against_the_flow(graph) == []
    graph["eagle2.training.features"] = graph["eagle2.training.features"] | {"eagle2.training.loop"}  # the old edge
    assert against_the_flow(graph) == ["eagle2.training.features -> eagle2.training.loop"]


def test_the_checks_catch_a_violation_and_a_cycle():
    graph = import_graph()
    graph["eagle2.core.engine"] = graph["eagle2.core.engine"] | {"eagle2.drafters.eagle2_dynamic"}
    graph["analysis.metrics"] = graph["analysis.metrics"] | {"eagle2.core.tree"}
    graph["eagle2.results.store"] = graph["eagle2.results.store"] | {"eagle2.bench.runner"}
    graph["tools.unruled"] = set()  # a module no rule covers
    assert layering_violations(graph) == ["analysis.metrics -> eagle2.core.tree",
                                          "eagle2.core.engine -> eagle2.drafters.eagle2_dynamic",
                                          "eagle2.results.store -> eagle2.bench.runner",
                                          "tools.unruled: no layering rule"]
    graph = import_graph()  # a cycle: the cost profile reaching back into the registry that calls it
    graph["eagle2.bench.cost_profile"] = graph["eagle2.bench.cost_profile"] | {"eagle2.bench.methods"}
    # (the policy's profile, which the registry calls and which calls the cost profile, joins the cycle)
    assert cycles(graph) == [["eagle2.bench.cost_profile", "eagle2.bench.methods", "eagle2.bench.policy_profile"]]


PLANTED = {  # module -> a source line planting an import the layering forbids (the two edges this layout removed)
    "eagle2.bench.rows": "from analysis.metrics import load_rows",
    "eagle2.training.corpora.prompts": "from eagle2.bench.runner import run",
    "eagle2.prompts.chat": "import eagle2.bench.models",
    "eagle2.results.store": "from eagle2.bench.methods import build_drafter",
    "eagle2.drafters.eagle2_dynamic": "from eagle2.bench.cost_profile import get_profile",  # drafters time nothing
    "eagle2.core.batch_engine": "from eagle2.bench.rows import make_row",
    "eagle2.identity": "from analysis.metrics import load_rows",  # the command reads no analysis
    "eagle2.registry": "from eagle2.results.store import config_hash",
}


@pytest.mark.parametrize("module", sorted(PLANTED))
def test_a_planted_forbidden_import_is_caught(module, tmp_path):
    """Negative control read from source: the module's real text plus one forbidden import line (bench ->
    analysis, training -> bench, prompts -> bench, results -> bench, a drafter -> the harness's cost profile,
    core -> bench) is reported, and only that edge."""
    modules = project_modules()
    planted = tmp_path / "planted.py"
    planted.write_text(modules[module].read_text() + f"\n\ndef _planted():\n    {PLANTED[module]}\n")
    graph = import_graph()
    graph[module] = imports_of(planted, set(modules)) - {module}
    target = PLANTED[module].split()[1]
    assert layering_violations(graph) == [f"{module} -> {target}"]


@pytest.mark.parametrize("module", sorted(project_modules()))
def test_module_has_a_docstring_and_stays_short(module):
    path = project_modules()[module]
    source = path.read_text()
    assert ast.get_docstring(ast.parse(source)), f"{path} has no module docstring"
    assert len(source.splitlines()) <= MAX_LINES, f"{path} has over {MAX_LINES} lines"
