"""The report: from a tiny real sweep on SmolLM2, and metrics/tables on hand-made rows.

The sweep (plain and EAGLE-2 with a random tiny head, two benchmarks, 4 new tokens) is run once per module.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir

from analysis.metrics import (
    calibration,
    expected_calibration_error,
    load_failures,
    load_nodes,
    load_rows,
    method_table,
    tree_budget_table,
)
from analysis.report import build_report, main
from analysis.tables import load_published, table1_frame, to_latex, to_markdown
from eagle2.bench.runner import run
from eagle2.heads.eagle_head import save_head
from tests.conftest import load_each_target_once, tiny_head

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ["speedup_bars", "calibration", "acceptance_by_position", "tree_budget"]


def config(*overrides):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=["logger=none", "warmup_tokens=0", "threads=1", "max_new_tokens=4",
                                            "dataset.limit=2", *overrides])


@pytest.fixture(scope="module")
def sweep(smollm2, tmp_path_factory, session_target_loads):
    """(results, report out): plain + EAGLE-2 on nq and gsm8k, and a second tree budget on nq (the five runs load
    the target once: conftest's ``load_each_target_once``)."""
    base = tmp_path_factory.mktemp("sweep")
    head = tiny_head(smollm2[0])
    head.draft_vocab = torch.arange(smollm2[0].config.vocab_size)  # serves any method.draft_vocab_size
    head_dir = save_head(head, base / "head")
    results = base / "results"
    tree = ["method.depth=3", "method.top_k=3"]
    with pytest.MonkeyPatch.context() as patch:
        load_each_target_once(patch, session_target_loads, keep=2)
        for dataset in ("nq", "gsm8k"):
            common = [f"dataset={dataset}", f"paths.results={results}", f"model.head={head_dir}"]
            run(config("method=plain", *common))
            run(config("method=eagle2", "method.total_tokens=6", *tree, *common))
        run(config("method=eagle2", "method.total_tokens=3", *tree, "dataset=nq", f"paths.results={results}",
                   f"model.head={head_dir}"))
    out = base / "report"
    assert main([str(results), "--out", str(out), "--wandb"]) == 0
    return results, out


def test_report_writes_every_output(sweep):
    results, out = sweep
    for name in FIGURES:
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / f"{name}.pdf").read_bytes()[:5] == b"%PDF-"
    for name in ("table1.md", "table1.tex", "table1.csv", "methods.csv", "calibration.csv",
                 "acceptance_by_position.csv", "tree_budget.csv", "summary.md"):
        assert (out / name).stat().st_size > 0, name
    summary = (out / "summary.md").read_text()
    for path in out.glob("*.*"):
        assert f"`{path.name}`" in summary  # every file written is listed
    assert "Errors while writing" not in summary and "## Failures still standing\n\nNone." in summary
    assert r"\begin{tabular}" in (out / "table1.tex").read_text()


def test_table_numbers_equal_metrics(sweep):
    results, out = sweep
    table = method_table(load_rows(results))
    cells = pd.read_csv(out / "table1.csv")
    md, tex = (out / "table1.md").read_text(), (out / "table1.tex").read_text()
    ours = table[table.method == "eagle2"]
    assert len(ours) == 3 and ours.speedup.notna().all() and (ours.baseline_turns == 2).all()
    for r in ours.itertuples():
        cell = cells[cells.config_hash == r.config_hash]
        assert len(cell) == 1 and cell.dataset.iloc[0] == r.dataset
        assert cell.speedup.iloc[0] == pytest.approx(r.speedup, rel=1e-9)
        assert cell.tau.iloc[0] == pytest.approx(r.tau, rel=1e-9)
        assert f"{r.speedup:.2f}x / {r.tau:.2f}" in md
        assert f"{r.speedup:.2f}" + r"$\times$ & " + f"{r.tau:.2f}" in tex
    six = ours[ours.config_hash.isin(cells[cells.label == "eagle2 (total_tokens=6)"].config_hash)]
    mean = cells[(cells.label == "eagle2 (total_tokens=6)") & (cells.dataset == "mean")]
    assert mean.speedup.iloc[0] == pytest.approx(six.speedup.mean()) and len(six) == 2
    tb = pd.read_csv(out / "tree_budget.csv")
    assert sorted(tb[tb.dataset == "nq"].total_tokens) == [3, 6]
    assert np.allclose(tb.sort_values("config_hash").tau, tree_budget_table(load_rows(results))
                       .sort_values("config_hash").tau)


def test_calibration_counts_match_the_node_records(sweep):
    results, out = sweep
    nodes = load_nodes(results)
    written = pd.read_csv(out / "calibration.csv")
    assert set(written.method) == {"eagle2"}
    expected = calibration(nodes)
    assert list(written["count"]) == list(expected["count"])
    verified = nodes[nodes.tree_index >= 0]
    assert 0 < written["count"].sum() <= len(verified)
    assert "ECE" not in written  # ECE is in the figure title; the bins are the data


def test_wandb_offline_run_has_the_figures(sweep):
    _, out = sweep
    runs = list((out / "wandb").rglob("*.wandb"))
    assert runs and runs[0].stat().st_size > 0
    images = " ".join(p.name for p in (out / "wandb").rglob("media/images/figure/*.png"))
    assert all(name in images for name in FIGURES)
    tables = " ".join(p.name for p in (out / "wandb").rglob("*.table.json"))
    assert "nodes_" in tables and "methods_" in tables and "table1_" in tables


def test_missing_inputs_are_notes_not_crashes(sweep, tmp_path):
    results, _ = sweep
    only_plain = tmp_path / "plain"
    for f in results.rglob("plain-*.jsonl"):
        dest = only_plain / f.relative_to(results)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dest)
    rep = build_report(only_plain, tmp_path / "out_plain")
    assert not rep.errors
    notes = " ".join(rep.notes)
    assert "no per-node records" in notes and "no tree-budget curves" in notes and "speedup bars" in notes
    no_plain = tmp_path / "no_plain"
    shutil.copytree(results, no_plain, ignore=shutil.ignore_patterns("plain-*"))
    rep = build_report(no_plain, tmp_path / "out_no_plain")
    assert not rep.errors and "no plain rows" in " ".join(rep.notes)
    assert "no baseline / " in (tmp_path / "out_no_plain" / "table1.md").read_text()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(empty), "--out", str(tmp_path / "o")]) == 0  # `python -m analysis.report`: test_bare_gpu_node
    assert "no finished rows" in (tmp_path / "o" / "summary.md").read_text()


# --- hand-made rows -----------------------------------------------------------------------------------------

def row(method, qid, tokens, wall, forwards=None, dataset="nq", model="smollm2", temperature=0.0, **settings):
    """A stored row with ``tokens`` decode tokens over ``forwards`` rounds (plain: one per round)."""
    forwards = forwards or tokens
    lengths = [tokens // forwards] * forwards
    lengths[-1] += tokens - sum(lengths)
    return {"question_id": qid, "turn": 0, "dataset": dataset, "model": model, "method": method,
            "temperature": temperature, "config_hash": f"{method}-{dataset}-{model}-{temperature}-{settings}",
            "status": "ok", "new_tokens": tokens + 1, "wall_time_s": wall, "target_forwards": forwards,
            "accept_lengths": lengths, "rounds": {"draft_forward_s": [0.0] * forwards,
                                                  "verify_forward_s": [wall / forwards] * forwards,
                                                  "other_s": [0.0] * forwards},
            "method_config": {"name": method, **settings}, "peak_memory_mb": 1.0, "timestamp": 1.0}


def store(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_speedup_is_the_tokens_per_second_ratio_on_common_turns(tmp_path):
    rows = [row("plain", 1, 10, 1.0), row("plain", 2, 20, 4.0), row("plain", 3, 100, 1.0),  # q3: eagle2 lacks it
            row("eagle2", 1, 12, 0.5, forwards=4), row("eagle2", 2, 30, 1.5, forwards=10),
            row("eagle2", 1, 12, 0.5, forwards=4, dataset="gsm8k")]  # gsm8k: no plain rows
    table = method_table(load_rows(store(tmp_path, rows))).set_index(["method", "dataset"])
    nq = table.loc[("eagle2", "nq")]
    assert nq.speedup == pytest.approx((42 / 2.0) / (30 / 5.0)) and nq.baseline_turns == 2
    assert nq.tau == pytest.approx(42 / 14) and table.loc[("plain", "nq")].tau == pytest.approx(1.0)
    assert np.isnan(table.loc[("eagle2", "gsm8k")].speedup)
    cells, _ = table1_frame(load_rows(tmp_path))
    md = to_markdown(cells)
    assert f"{(42 / 2.0) / (30 / 5.0):.2f}x / {42 / 14:.2f}" in md and "no baseline / 3.00" in md
    assert "n/b" in to_latex(cells)
    mean = cells[(cells.dataset == "mean")]
    assert len(mean) == 1 and np.isnan(mean.speedup.iloc[0])  # one benchmark without baseline: no mean speedup
    assert mean.tau.iloc[0] == pytest.approx((42 / 14 + 3.0) / 2)


def test_published_numbers_sit_beside_ours_for_a_paper_model(tmp_path):
    datasets = ["mt_bench", "humaneval", "gsm8k", "alpaca", "cnn_dm", "nq"]
    rows = [r for d in datasets for r in (row("plain", 1, 10, 1.0, dataset=d, model="vicuna7b"),
                                          row("eagle2", 1, 40, 0.5, forwards=10, dataset=d, model="vicuna7b"))]
    cells, _ = table1_frame(load_rows(store(tmp_path, rows)), load_published())
    paper = cells[cells.source == "paper"]
    assert set(paper.label) == {"EAGLE-2 (paper, V7B)"}
    mt = paper[paper.dataset == "mt_bench"].iloc[0]
    assert (mt.speedup, mt.tau) == (3.62, 4.98)
    mean = paper[paper.dataset == "mean"].iloc[0]
    assert (mean.speedup, mean.tau) == (3.39, 4.68)  # the paper's own Mean column
    md, tex = to_markdown(cells), to_latex(cells)
    assert "| EAGLE-2 (paper, V7B) | 3.62x / 4.98" in md and "8.00x / 4.00" in md
    assert r"EAGLE-2 (paper, V7B) & 3.62$\times$ & 4.98" in tex
    assert md.index("| eagle2 ") < md.index("| EAGLE-2 (paper")  # ours first, the paper right under it


def test_calibration_bins_count_only_tried_nodes():
    base = {"question_id": 1, "turn": 0, "dataset": "nq", "model": "m", "method": "eagle2", "temperature": 0.0,
            "config_hash": "h", "round": 0, "depth": 1, "rank": 0, "value": 0.0}
    nodes = pd.DataFrame([
        {**base, "tree_index": 1, "parent_tree_index": 0, "confidence": 0.92, "accepted": True},
        {**base, "tree_index": 2, "parent_tree_index": 0, "confidence": 0.05, "accepted": False},
        {**base, "tree_index": 3, "parent_tree_index": 1, "confidence": 0.85, "accepted": False},
        {**base, "tree_index": 4, "parent_tree_index": 2, "confidence": 0.95, "accepted": False},  # parent rejected
        {**base, "tree_index": -1, "parent_tree_index": 1, "confidence": 0.55, "accepted": False},  # not verified
    ])
    table = calibration(nodes).set_index("bin")
    assert list(table.index) == [0, 8, 9] and list(table["count"]) == [1, 1, 1]
    assert list(table.acceptance) == [0.0, 0.0, 1.0]
    assert expected_calibration_error(nodes)["eagle2"] == pytest.approx((0.05 + 0.85 + 0.08) / 3)


def test_failures_stand_until_a_later_success(tmp_path):
    cell_fail = {"question_id": None, "turn": None, "dataset": "nq", "model": "m", "method": "eagle2",
                 "temperature": 0.0, "config_hash": "a", "status": "failed", "error": "no head", "timestamp": 1.0}
    turn_fail = {**cell_fail, "question_id": 7, "turn": 0, "config_hash": "b", "error": "OOM"}
    ok_later = {**row("eagle2", 1, 4, 1.0), "config_hash": "a", "timestamp": 2.0}
    store(tmp_path / "one", [cell_fail, turn_fail])
    standing = load_failures(tmp_path / "one")
    assert sorted(standing.scope) == ["cell", "turn"]
    store(tmp_path / "two", [cell_fail, turn_fail, ok_later, {**row("eagle2", 7, 4, 1.0), "config_hash": "b"}])
    assert load_failures(tmp_path / "two").empty


def test_report_writes_a_stamped_results_page(sweep, tmp_path):
    """``--page``: the page's table holds method_table's numbers, and the stamp names commit, machine, command."""
    from analysis.results_page import headline_block, stamp_of

    results, _ = sweep
    page = tmp_path / "docs" / "results" / "kind.md"
    assert main([str(results), "--out", str(tmp_path / "out"), "--page", str(page), "--commit", "abc1234",
                 "--command", "python run.py -m experiment=headline"]) == 0
    text = page.read_text()
    stamp = stamp_of(text)
    assert stamp["Commit"] == "`abc1234`" and stamp["Command"] == "`python run.py -m experiment=headline`"
    rows = load_rows(results)
    assert stamp["Machine"] == f"CPU kind {rows.cpu_kind.iloc[0]}" and stamp["Dtype"].split()[0] == rows.dtype.iloc[0]
    assert "head `" in stamp["Drafters"]
    block = headline_block(text)
    for r in method_table(rows).itertuples():
        line = f"| {r.turns} | {r.tokens_per_s:.1f} | {r.speedup:.2f}x | {r.tau:.2f} |"
        assert line in block, line
    # two benchmarks: the Table 1 layout follows the marked block, each of our cells as speedup / tau
    layout = text.split("<!-- headline:end -->", 1)[1]
    assert "Table 1" in layout and "| Method " in layout and "| GSM8K " in layout and "| NaturalQ " in layout
    for r in method_table(rows)[lambda t: t.method == "eagle2"].itertuples():
        assert f"{r.speedup:.2f}x / {r.tau:.2f}" in layout
    assert main([str(tmp_path / "out"), "--out", str(tmp_path / "o2"), "--page", str(tmp_path / "p.md")]) == 1
