"""The speedup-versus-batch curve on hand-made rows: batch throughput (all new tokens over the union of the
rows' spans), speedup over plain at the same B, plain's B-over-B=1 ratio, the figure and the report."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from analysis.batch_scaling import has_batch_sweep, scaling_figure, scaling_markdown, scaling_table
from analysis.report import build_report
from eagle2.results.throughput import batch_throughput, union_length, wall_span


def row(method, batch_size, qid, tokens, prefill, wall, span=None, run_start=1000.0):
    """A finished row; ``span`` = (admitted, retired) seconds into its batch run (batched rows only)."""
    admitted, retired = span or (None, None)
    return {"model": "m", "dataset": "mt_bench", "method": method, "temperature": 0.0, "status": "ok",
            "config_hash": f"{method}{batch_size}", "question_id": qid, "turn": 0, "new_tokens": tokens,
            "accept_lengths": [1] * (tokens - 1), "target_forwards": tokens - 1, "rounds": {},
            "prefill_time_s": prefill, "wall_time_s": wall, "tokens_per_s": (tokens - 1) / wall,
            "batch_size": batch_size, "batch_admitted_at": admitted, "batch_retired_at": retired,
            "batch_run_start": None if span is None else run_start, "max_new_tokens": 32, "seed": 0,
            "dtype": "float32", "timestamp": 0.0}


ROWS = [
    row("plain", 1, 1, 10, 0.5, 4.5), row("plain", 1, 2, 10, 0.5, 4.5),  # 20 tokens in 10 s: 2.0
    row("eagle2", 1, 1, 10, 0.5, 2.0), row("eagle2", 1, 2, 10, 0.5, 2.0),  # 20 in 5 s: 4.0
    row("plain", 2, 1, 10, 0.5, 4.5, (0.0, 5.0)), row("plain", 2, 2, 10, 0.5, 3.5, (1.0, 5.0)),  # 20 in 5 s
    row("eagle2", 2, 1, 10, 0.5, 1.5, (0.0, 2.0)), row("eagle2", 2, 2, 10, 0.5, 0.5, (3.0, 4.0)),  # 20 in 3 s
]


def test_union_of_spans_counts_overlap_once():
    assert union_length([(0, 5), (1, 5)]) == 5
    assert union_length([(3, 4), (0, 2)]) == 3
    assert union_length([(0, 2), (1, 3), (2.5, 6), (10, 11)]) == 7
    # two runs of the same config (a rerun after a kill): spans from different run starts never overlap
    rerun = [row("plain", 2, 1, 10, 0.5, 4.5, (0.0, 5.0), 1000.0), row("plain", 2, 2, 10, 0.5, 4.5, (0.0, 5.0), 2000.0)]
    assert wall_span(rerun) == 10
    assert wall_span(ROWS[:2]) == 10  # batch 1: back to back, prefill included


def test_batch_throughput_and_per_request_figures():
    t = batch_throughput(ROWS[4:6])
    assert t["throughput_tokens_per_s"] == pytest.approx(4.0) and t["wall_span_s"] == pytest.approx(5.0)
    assert t["request_tokens_per_s"] == pytest.approx((9 / 4.5 + 9 / 3.5) / 2)
    assert t["mean_latency_s"] == pytest.approx(4.5)
    nan_fields = pd.DataFrame(ROWS[:2] + ROWS[4:6]).to_dict("records")  # pandas fills None with NaN
    assert batch_throughput(nan_fields)["wall_span_s"] == pytest.approx(15.0)


def test_scaling_table_speedup_over_plain_at_the_same_batch_size():
    table = scaling_table(pd.DataFrame(ROWS)).set_index(["method", "batch_size"])
    assert table.throughput.to_dict() == pytest.approx(
        {("plain", 1): 2.0, ("plain", 2): 4.0, ("eagle2", 1): 4.0, ("eagle2", 2): 20 / 3})
    assert table.speedup.to_dict() == pytest.approx(
        {("plain", 1): 1.0, ("plain", 2): 1.0, ("eagle2", 1): 2.0, ("eagle2", 2): 20 / 3 / 4})
    assert table.loc[("plain", 2), "scaling"] == pytest.approx(2.0)
    assert table.loc[("eagle2", 2), "scaling"] == pytest.approx(20 / 3 / 4)
    text = scaling_markdown(scaling_table(pd.DataFrame(ROWS)))
    assert "| Plain | 2.00 (1.00x) | 4.00 (1.00x) |" in text
    assert "| EAGLE-2 | 4.00 (2.00x) | 6.67 (1.67x) |" in text
    assert "B=2: 2.00x" in text


def test_no_plain_baseline_leaves_speedup_empty():
    table = scaling_table(pd.DataFrame([r for r in ROWS if r["method"] != "plain"]))
    assert table.speedup.isna().all() and table.throughput.notna().all()
    assert not has_batch_sweep(pd.DataFrame(ROWS[:4])) and has_batch_sweep(pd.DataFrame(ROWS))


def test_figure_and_report_section(tmp_path):
    paths = scaling_figure(scaling_table(pd.DataFrame(ROWS)), tmp_path / "fig")
    png = [p for p in paths if p.suffix == ".png"]
    assert png and png[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png[0].stat().st_size < 300_000
    results = tmp_path / "results"
    results.mkdir()
    (results / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    rep = build_report(results, tmp_path / "report", published=tmp_path / "none.tsv")
    assert not [e for e in rep.errors if e.startswith("batch scaling")], rep.errors
    assert (tmp_path / "report" / "batch_scaling.png").exists()
    assert "6.67 (1.67x)" in (tmp_path / "report" / "batch_scaling.md").read_text()
    csv = pd.read_csv(tmp_path / "report" / "batch_scaling.csv")
    assert csv.set_index(["method", "batch_size"]).speedup[("eagle2", 1)] == pytest.approx(2.0)


def test_batch_scaling_experiments_compose():
    """``experiment=batch_scaling`` sweeps B = 1, 2, 4, 8 x five methods on 10 MT-bench questions on CPU;
    ``batch_scaling_gpu`` sweeps B = 1..64 on every question on a GPU; each cell hashes its batch size."""
    from eagle2.results.store import config_hash
    from tests.test_harness import compose_cfg

    cpu = compose_cfg("experiment=batch_scaling", hydra_cfg=True)
    assert dict(cpu.hydra.sweeper.params) == {"batch_size": "1,2,4,8", "method": "plain,sps,eagle2,eagle3,pld"}
    assert cpu.dataset.name == "mt_bench" and cpu.dataset.limit == 10 and cpu.paths.results == "results/batch_scaling"
    gpu = compose_cfg("experiment=batch_scaling_gpu", "model=vicuna7b", hydra_cfg=True)
    assert gpu.hydra.sweeper.params.batch_size == "1,2,4,8,16,32,64" and gpu.dataset.limit is None
    assert gpu.hydra.sweeper.params.method == cpu.hydra.sweeper.params.method
    cells = {b: compose_cfg("experiment=batch_scaling", f"batch_size={b}", "method=eagle2") for b in (1, 2, 8)}
    assert {b: c.batch_size for b, c in cells.items()} == {1: 1, 2: 2, 8: 8}
    assert len({config_hash(c) for c in cells.values()}) == 3
