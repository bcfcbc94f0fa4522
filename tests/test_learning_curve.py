"""The learning curve of head training: val rows carry the tokens trained and passes over the corpus, the
flat-curve stop (``curve_flat``: ``stop_when_flat`` validations in a row gaining < ``flat_gain``) ends a run
and survives a resume, and ``analysis.learning_curve`` draws the rows."""

from __future__ import annotations

from analysis.learning_curve import plot_curves, validation_rows
from eagle2.training.loop import curve_flat
from eagle2.training.train import train_head
from tests.test_training import corpus, head_cfg, target  # noqa: F401  (fixtures)


def test_curve_flat_by_hand():
    assert not curve_flat([0.1, 0.2, 0.3, 0.4], evals=3, min_gain=0.005)  # still rising
    assert curve_flat([0.1, 0.3, 0.302, 0.301, 0.304], evals=3, min_gain=0.005)  # +0.002, -0.001, +0.002
    assert not curve_flat([0.1, 0.3, 0.302, 0.301, 0.31], evals=3, min_gain=0.005)  # the last one gained 0.008
    assert not curve_flat([0.3, 0.3, 0.3], evals=3, min_gain=0.005)  # needs evals + 1 validations
    assert not curve_flat([0.3, 0.3, 0.3, 0.3], evals=0, min_gain=0.005)  # 0 = never stop


def test_flat_curve_stops_training_and_the_rows_draw(target, corpus, tmp_path):  # noqa: F811
    cfg = head_cfg(epochs=8, val_every=2, stop_when_flat=2, flat_gain=1.0)  # any gain < 1: flat at the 3rd
    head, summary = train_head(target, corpus, cfg, tmp_path / "run")
    assert summary["flat"] and summary["stopped"] and summary["step"] == 6 < summary["total_steps"]
    rows = validation_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [2, 4, 6] and len(summary["curve"]) == 3
    tokens = [r["tokens_trained"] for r in rows]
    assert tokens == sorted(tokens) and tokens[0] > 0 and rows[-1]["passes"] == summary["passes"] > 0
    assert plot_curves({"run": rows}, tmp_path / "curve.png").stat().st_size > 1000


def test_tokens_and_curve_survive_a_resume(target, corpus, tmp_path):  # noqa: F811
    cfg = head_cfg(epochs=2, val_every=2)
    _, ref = train_head(target, corpus, cfg, tmp_path / "ref")
    train_head(target, corpus, cfg, tmp_path / "cut", stop_after=4)
    _, resumed = train_head(target, corpus, cfg, tmp_path / "cut")
    assert resumed["tokens_trained"] == ref["tokens_trained"] and resumed["curve"] == ref["curve"]
