"""The report says what it could not use and never merges configs that decode differently: an unreadable
(torn) line is counted and named, rows of two dtypes stay two Table 1 lines with their dtype (in
methods.csv too), a speedup is over plain of the same dtype, and 'no baseline' names the plain rows missing."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from analysis.report import build_report, main
from analysis.speedup import speedup_lines
from eagle2.results.frames import baseline_rows, load_rows
from tests.test_report import row


def rows_file(folder, rows, tail: str = ""):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


def with_dtype(dtype, rows):
    for r in rows:
        r["dtype"] = dtype
        r["config_hash"] += dtype
    return rows


def test_a_torn_last_line_is_counted_and_named(tmp_path, capsys):
    path = rows_file(tmp_path / "results", [row("plain", q, 10, 1.0) for q in range(3)],
                     tail='{"question_id": 3, "turn": 0, "datas')
    assert main([str(tmp_path / "results"), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "1 unreadable line(s)" in printed and f"{path}:4" in printed
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "3 finished question turns" in summary and f"{path}:4" in summary


def test_two_dtypes_are_two_lines_each_with_its_own_baseline(tmp_path):
    results = tmp_path / "results"
    rows_file(results / "bf16", with_dtype("bfloat16", [row("plain", q, 10, 1.0) for q in range(6)]
                                          + [row("pld", q, 12, 0.5, forwards=5) for q in range(6)]))
    rows_file(results / "fp32", with_dtype("float32", [row("pld", q, 12, 0.8, forwards=5) for q in range(6)]))
    rep = build_report(results, tmp_path / "out")
    table1 = pd.read_csv(tmp_path / "out" / "table1.csv")
    ours = table1[(table1.source == "ours") & (table1.dataset == "nq")].set_index("label")
    assert set(ours.index) == {"pld (bfloat16)", "pld (float32)"} and set(ours.turns) == {6}
    assert ours.loc["pld (bfloat16)"].speedup == (72 / 3.0) / (60 / 6.0)  # over the bf16 plain rows
    assert np.isnan(ours.loc["pld (float32)"].speedup)
    methods = pd.read_csv(tmp_path / "out" / "methods.csv")
    assert sorted(methods.dtype) == ["bfloat16", "bfloat16", "float32"]
    assert not any("not shown" in n or n.startswith("no plain rows") for n in rep.notes), rep.notes
    [missing] = [n for n in rep.notes if "'no baseline'" in n]
    assert "pld (float32" in missing and "no plain rows of smollm2 on nq at T=0" in missing
    assert "dtype float32" in missing
    md = (tmp_path / "out" / "table1.md").read_text()
    assert "pld (float32)" in md and "pld (bfloat16)" in md
    lines = speedup_lines(str(results))
    assert any("pld float32" in line and "no baseline (no plain rows" in line for line in lines), lines


def test_equal_configs_of_one_label_say_which_is_shown(tmp_path):
    results = tmp_path / "results"
    short = [dict(row("pld", q, 12, 0.6), max_new_tokens=16, config_hash="short") for q in range(2)]
    rows_file(results, [row("plain", q, 10, 1.0) for q in range(2)] + [row("pld", q, 12, 0.5) for q in range(2)]
              + short)
    rep = build_report(results, tmp_path / "out")
    [note] = [n for n in rep.notes if "not shown" in n]
    assert "as many turns (2)" in note and "more turns" not in note, note


def test_a_run_past_its_stop_tokens_pairs_with_plain_run_past_them_and_old_rows_stopped(tmp_path):
    """``ignore_eos`` runs pair with plain rows of the same setting; rows stored before the field (no key) count as
    stopping at their stop tokens, so a new run that stops still finds its old plain rows."""
    old_plain = [row("plain", q, 10, 1.0) for q in range(3)]  # no ignore_eos key: written before the field
    past_plain = [dict(row("plain", q, 10, 2.0), ignore_eos=True, config_hash="plain-past") for q in range(3)]
    stops = [dict(row("pld", q, 12, 0.5, forwards=5), ignore_eos=False) for q in range(3)]
    past = [dict(row("pld", q, 12, 0.5, forwards=5), ignore_eos=True, config_hash="pld-past") for q in range(3)]
    rows = load_rows(rows_file(tmp_path / "results", old_plain + past_plain + stops + past).parent)
    assert set(baseline_rows(rows, rows[rows.config_hash == stops[0]["config_hash"]]).config_hash) == {
        old_plain[0]["config_hash"]}
    assert set(baseline_rows(rows, rows[rows.config_hash == "pld-past"]).config_hash) == {"plain-past"}
