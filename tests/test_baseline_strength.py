"""Speedups over eager AND compiled plain decoding (``experiment=baseline_strength``), on hand-made rows.

Rows of both kinds (the ``compile`` field: eager or compiled target forward) give every config a speedup over
each plain, Table 1 and the results page show both columns and the kind in each label, and plain decoding's own
rows show the one plain over the other. A folder of one kind, written before any of this (rows without the
field, or with ``auto:false``), reports exactly the tables it always did: ``GOLDEN`` holds what the code before
this change wrote for ``old_rows()``.

Negative control (by hand, once): ``baseline_rows`` with its kind filter removed (any plain, the one sharing the
most turns) fails ``test_each_config_is_measured_against_each_plain``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analysis.metrics import load_rows, method_table
from analysis.report import build_report
from analysis.results_page import headline_table
from analysis.tables import table1_frame, to_latex, to_markdown
from eagle2.results.frames import baseline_rows, both_kinds, compiled

GOLDEN = Path(__file__).with_name("golden") / "one_kind_tables.md"


def row(method, qid, tokens, wall, forwards=None, dataset="nq", dtype="float32", compile=None, **settings):
    """A stored row: ``tokens`` decode tokens in ``wall`` seconds over ``forwards`` rounds; ``compile`` as the
    runner stores it (None: a row from before the field existed)."""
    forwards = forwards or tokens
    lengths = [tokens // forwards] * forwards
    lengths[-1] += tokens - sum(lengths)
    out = {"question_id": qid, "turn": 0, "dataset": dataset, "model": "smollm2", "method": method,
           "temperature": 0.0, "config_hash": f"{method}-{dataset}-{dtype}-{compile}-{sorted(settings.items())}",
           "status": "ok", "new_tokens": tokens + 1, "wall_time_s": wall, "target_forwards": forwards,
           "accept_lengths": lengths, "max_new_tokens": 48, "seed": 0, "dtype": dtype,
           "rounds": {"draft_forward_s": [0.0] * forwards, "verify_forward_s": [wall / forwards] * forwards,
                      "other_s": [0.0] * forwards},
           "method_config": {"name": method, **settings}, "peak_memory_mb": 1.0, "timestamp": 1.0}
    if compile is not None:
        out["compile"] = compile
    return out


def store(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def old_rows() -> list[dict]:
    """A folder of one kind as written before: two benchmarks, two dtypes, three methods, two eagle2 budgets."""
    out = []
    for d, dataset in enumerate(("mt_bench", "gsm8k")):
        for dtype, slow in (("float32", 1.0), ("bfloat16", 0.8)):
            kind = "auto:false" if dtype == "bfloat16" else None  # rows with and without the field
            for q in (1, 2):
                out += [row("plain", q, 40, 2.0 * slow + 0.1 * q, dataset=dataset, dtype=dtype, compile=kind),
                        row("sps", q, 40, 1.5 * slow + 0.1 * d, forwards=20, dataset=dataset, dtype=dtype,
                            compile=kind, k=4),
                        row("eagle2", q, 40, 1.0 * slow + 0.05 * q, forwards=12, dataset=dataset, dtype=dtype,
                            compile=kind, total_tokens=8),
                        row("eagle2", q, 40, 0.9 * slow, forwards=10, dataset=dataset, dtype=dtype,
                            compile=kind, total_tokens=16)]
    return out


def rendered(rows) -> str:
    """Table 1 (markdown and LaTeX) and the results page's headline table, as one text."""
    cells, _ = table1_frame(rows)
    return "\n".join([to_markdown(cells), to_latex(cells), headline_table(rows)])


def test_a_folder_of_one_kind_reports_the_tables_it_always_did(tmp_path):
    rows = load_rows(store(tmp_path, old_rows()))
    assert not both_kinds(rows)
    assert rendered(rows) == GOLDEN.read_text()
    compiled_only = load_rows(store(tmp_path / "c", [{**r, "compile": "true"} for r in old_rows()]))
    assert rendered(compiled_only) == GOLDEN.read_text()  # all compiled: one kind too, the same tables


def mixed_rows() -> list[dict]:
    """Eager plain 10 tok/s, compiled plain 12.5; eagle2 eager 20, eagle2 compiled 30 (one benchmark, 2 turns)."""
    out = []
    for q in (1, 2):
        out += [row("plain", q, 40, 4.0, compile="false"), row("plain", q, 40, 3.2, compile="true"),
                row("eagle2", q, 40, 2.0, forwards=10, compile="false"),
                row("eagle2", q, 40, 40 / 30, forwards=10, compile="true")]
    return out


def test_each_config_is_measured_against_each_plain(tmp_path):
    rows = load_rows(store(tmp_path, mixed_rows()))
    assert both_kinds(rows) and compiled(rows).sum() == 4
    table = method_table(rows).set_index(["method", "compiled"])
    expect = {("plain", False): (1.0, 0.8), ("plain", True): (1.25, 1.0),
              ("eagle2", False): (2.0, 1.6), ("eagle2", True): (3.0, 2.4)}
    for key, (over_eager, over_compiled) in expect.items():
        line = table.loc[key]
        assert line.speedup_eager == pytest.approx(over_eager) and line.speedup_compiled == pytest.approx(
            over_compiled), key
        assert line.speedup == pytest.approx(over_compiled if key[1] else over_eager)  # like with like
        assert line.speedup_fastest == pytest.approx(over_compiled)  # compiled plain is the faster here
        assert line.baseline == ("compiled" if key[1] else "eager") and line.speedup_eager_turns == 2
    g = rows[(rows.method == "eagle2") & compiled(rows)]
    assert compiled(baseline_rows(rows, g, "eager")).sum() == 0 and compiled(baseline_rows(rows, g)).all()
    with pytest.raises(ValueError, match="baseline"):
        baseline_rows(rows, g, "fastest")


def test_table1_and_the_page_show_both_columns(tmp_path):
    rows = load_rows(store(tmp_path, mixed_rows()))
    cells, _ = table1_frame(rows)
    md, tex, page = to_markdown(cells), to_latex(cells), headline_table(rows)
    assert "speedup over eager plain / over compiled plain" in md
    assert "| eagle2 [compiled] | 3.00x / 2.40x / 4.00 | 3.00x / 2.40x / 4.00 |" in md
    assert "| eagle2 [eager]    | 2.00x / 1.60x / 4.00 |" in md
    assert "| plain [compiled]  | 1.25x / 1.00x / 1.00 |" in md and "| plain [eager]     | 1.00x / 0.80x / 1.00 |" in md
    assert r"over eager & over compiled & $\tau$" in tex
    assert r"eagle2 [compiled] & 3.00$\times$ & 2.40$\times$ & 4.00" in tex
    assert "| method | turns | tokens/s | speedup over eager plain | over the fastest plain | tau |" in page
    assert "| eagle2 [compiled] | 2 | 30.0 | 3.00x | 2.40x | 4.00 |" in page
    assert "| plain [eager] | 2 | 10.0 | 1.00x | 0.80x | 1.00 |" in page


def test_the_report_writes_both_columns(tmp_path):
    rep = build_report(store(tmp_path / "r", mixed_rows()), tmp_path / "o")  # the published table read too
    assert not rep.errors, rep.errors
    methods = (tmp_path / "o" / "methods.md").read_text()
    assert "speedup_eager" in methods and "speedup_compiled" in methods and "eagle2 [compiled]" in methods
    assert "over eager plain / over compiled plain" in (tmp_path / "o" / "table1.md").read_text()


def test_a_missing_plain_kind_reads_no_baseline(tmp_path):
    rows = load_rows(store(tmp_path, [r for r in mixed_rows() if not (r["method"] == "plain" and r["compile"] ==
                                                                       "true")]))
    table = method_table(rows).set_index(["method", "compiled"])
    assert np.isnan(table.loc[("eagle2", True)].speedup_compiled)
    assert table.loc[("eagle2", True)].speedup_eager == pytest.approx(3.0)
    assert table.loc[("eagle2", True)].speedup_fastest == pytest.approx(3.0)  # the one plain there is the fastest
    assert np.isnan(table.loc[("eagle2", True)].speedup)  # its own kind's plain is missing: no silent fallback
    md = to_markdown(table1_frame(rows)[0])
    assert "| eagle2 [compiled] | 3.00x / no baseline / 4.00 |" in md


def test_the_fastest_plain_is_whichever_is_faster(tmp_path):
    """Compiled plain slower than eager plain (8 against 10 tok/s): the fastest baseline is the eager one."""
    out = []
    for q in (1, 2):
        out += [row("plain", q, 40, 4.0, compile="false"), row("plain", q, 40, 5.0, compile="true"),
                row("eagle2", q, 40, 2.0, forwards=10, compile="false")]
    table = method_table(load_rows(store(tmp_path, out))).set_index(["method", "compiled"])
    assert table.loc[("eagle2", False)].speedup_compiled == pytest.approx(2.5)
    assert table.loc[("eagle2", False)].speedup_fastest == pytest.approx(2.0)
    assert table.loc[("plain", True)].speedup_fastest == pytest.approx(0.8)
