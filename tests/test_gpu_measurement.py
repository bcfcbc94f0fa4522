"""Device-correct measurement and budgets counted as the authors count them.

- every timed section goes through ``eagle2.core.clock.device_clock`` (a CUDA sync before the clock) or,
  for decoding rounds, ``eagle2.core.clock`` (CUDA events read once per generation; tests/test_clock.py);
- CUDA out of memory in one sweep cell (raised here from a fake forward, or from a fake loader) is a
  failed row, and the sweep goes on with the next cells;
- rows record the EAGLE-2 budget in both forms (ours in ``method_config``, the authors' in
  ``authors_budget``): their ``total_token`` counts the root, their ``depth`` the expansions after the
  first layer, so ours (8, 3, 4) is their (9, 2, 4).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import eagle2.bench.rows as rows
import eagle2.bench.runner as runner
import eagle2.core.engine as engine
from eagle2.core.clock import device_clock
from eagle2.heads.eagle_head import save_head
from eagle2.heads.family import families
from eagle2.results.store import read_rows
from tests.conftest import tiny_head

ROOT = Path(__file__).resolve().parents[1]
TIMED_SOURCES = ("eagle2", "experiments")


def perf_counter_outside_device_clock() -> list[str]:
    """``file:line`` of every ``perf_counter`` read in the library and experiments but device_clock's own and
    the event clock's CPU marks."""
    hits = []
    for folder in TIMED_SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                clocks = path.name == "clock.py"  # device_clock and the event clock's CPU marks
                if re.search(r"perf_counter\s*\(", line) and not clocks:
                    hits.append(f"{path.relative_to(ROOT)}:{i}")
    return hits


def test_every_timed_section_synchronises_the_device():
    assert perf_counter_outside_device_clock() == []


def test_the_timing_check_catches_an_unsynchronised_clock(tmp_path, monkeypatch):
    """Negative control: a timed section reading perf_counter directly is found."""
    bad = tmp_path / "experiments"
    bad.mkdir()
    (bad / "bench.py").write_text("import time\nstart = time.perf_counter()\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert perf_counter_outside_device_clock() == ["experiments/bench.py:2"]


def test_device_clock_synchronises_cuda(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    device_clock("cpu")
    assert calls == []
    device_clock("cuda:0")
    assert calls == ["cuda:0"]


@pytest.mark.parametrize("ours,theirs", [((8, 3, 4), (9, 2, 4)), ((59, 6, 10), (60, 5, 10)),
                                         (("auto", 3, 4), (-1, 2, 4))])
def test_authors_budget_counts_the_root_and_the_first_layer(ours, theirs):
    total, depth, top_k = ours
    cfg = OmegaConf.create({"name": "eagle2", "total_tokens": total, "depth": depth, "top_k": top_k})
    assert rows.authors_budget(cfg) == dict(zip(("total_token", "depth", "top_k"), theirs))
    assert rows.authors_budget(OmegaConf.create({"name": "plain"})) == {}


def test_gpu_configs_reproduce_the_authors_evaluation_budget():
    from tests.test_runner import config

    for model in ("vicuna7b", "vicuna13b", "llama2chat7b", "llama2chat13b", "llama2chat70b", "llama3_8b",
                  "llama3_70b"):
        cfg = config(f"model={model}", "method=eagle2")
        assert rows.authors_budget(cfg.method) == {"total_token": 60, "depth": 5, "top_k": 10}, model


def _oom(*_args, **_kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (fake, raised by a test)")


@pytest.mark.heavy  # a sweep on SmolLM2: in CI after make test
def test_cuda_oom_in_a_sweep_cell_is_a_failed_row_and_the_sweep_goes_on(tmp_path, smollm2, monkeypatch):
    """A three-cell sweep (``run.py -m``, in this process): SpS runs out of memory loading its draft, EAGLE-2
    in every tree verification (a fake forward), plain decoding is untouched. Each OOM is a failed row,
    EAGLE-2 goes on to its next question, and the sweep reaches plain decoding."""
    import runpy

    real_forward = engine.forward_target

    def forward_oom_on_trees(model, input_ids, cache, **kw):
        if input_ids.shape[1] > 1 and kw.get("attention_mask") is not None and cache.get_seq_length() > 0:
            _oom()  # a tree verification; the prefill and plain decoding's one-token rounds pass
        return real_forward(model, input_ids, cache, **kw)

    monkeypatch.setattr(engine, "forward_target", forward_oom_on_trees)
    monkeypatch.setitem(families(), "sps_draft", dataclasses.replace(families()["sps_draft"], load=_oom))
    head = save_head(tiny_head(smollm2[0]), tmp_path / "head")
    results = tmp_path / "results"
    monkeypatch.setattr(sys, "argv", [
        "run.py", "-m", "method=sps,eagle2,plain", "dataset=gsm8k", "dataset.limit=2", "max_new_tokens=4",
        "model.dtype=float32", f"model.head={head}", "model.eagle2.total_tokens=4", "logger=none", "warmup_tokens=0",
        "threads=1", f"paths.results={results}", f"hydra.sweep.dir={tmp_path / 'multirun'}"])
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(ROOT / "run.py"), run_name="__main__")
    rows = [r for path in sorted(results.rglob("*.jsonl")) for r in read_rows(path)]
    by_method = {m: [r for r in rows if r["method"] == m] for m in ("sps", "eagle2", "plain")}
    assert [r["scope"] for r in by_method["sps"]] == ["cell"]
    assert "OutOfMemoryError" in by_method["sps"][0]["error"]
    assert [r["status"] for r in by_method["eagle2"]] == ["failed", "failed"]  # both questions tried
    assert all("CUDA out of memory" in r["error"] for r in by_method["eagle2"])
    assert [r["status"] for r in by_method["plain"]] == ["ok", "ok"]
    assert all(r["authors_budget"] == {} and r["peak_memory_mb"] > 0 for r in by_method["plain"])


def test_eagle2_rows_record_both_budget_forms(tmp_path, smollm2):
    from tests.test_runner import config

    head = save_head(tiny_head(smollm2[0]), tmp_path / "head")
    runner.run(config("method=eagle2", "method.total_tokens=8", "method.depth=3", "method.top_k=4", "dataset=gsm8k",
                      "dataset.limit=1", "max_new_tokens=3", "model.dtype=float32", f"model.head={head}",
                      f"paths.results={tmp_path}", "threads=1"))
    (row,) = [r for path in tmp_path.rglob("*.jsonl") for r in read_rows(path)]
    ours = row["method_config"]
    assert (ours["total_tokens"], ours["depth"], ours["top_k"]) == (8, 3, 4)
    assert row["authors_budget"] == {"total_token": 9, "depth": 2, "top_k": 4}
    # their total_token 9 = the tokens verified per round: 8 drafted nodes + the root
    assert max(row["rounds"]["tree_size"]) == 9



def test_sampling_coins_are_drawn_on_the_generators_device(monkeypatch):
    """A CUDA generator cannot draw a CPU tensor: the coin of ``TorchDraws.accept`` is drawn on the
    generator's device (seen here through a stand-in generator; the gpu-marked tests run it for real)."""
    from types import SimpleNamespace

    from eagle2.core.sampling import TorchDraws

    seen = []
    monkeypatch.setattr(torch, "rand", lambda *shape, generator=None, device=None, **_: seen.append(device) or
                        torch.zeros(*shape))
    TorchDraws(SimpleNamespace(device=torch.device("cuda", 0))).accept(0.5)
    TorchDraws(None).accept(0.5)
    assert seen == [torch.device("cuda", 0), torch.device("cpu")]
