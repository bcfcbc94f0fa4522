"""The best checkpoint by a held-out measure (``train.*.best_by``, ``eagle2.training.best``): a run validated with a
planted tau curve that peaks and falls ends with the peak's weights (what the export writes), its rows carry tau
and top-1 both, the flat stop follows tau, and the learning-curve figure draws tau beside top-1."""

from __future__ import annotations

import json

import pytest
import torch

from eagle2.training.best import best_measure
from eagle2.training.objectives.eagle import train_head
from eagle2.training.support.models import trainable_state
from tests.test_training import corpus, head_cfg, target  # noqa: F401 (fixtures)

PLANTED = [1.2, 1.6, 1.9, 1.5, 1.4, 1.3]  # tau by validation: the peak is the 3rd


def planted_tau(seen: list):
    def measure(module) -> dict:
        seen.append({k: v.clone() for k, v in trainable_state(module).items()})
        return {"chain_tau": PLANTED[min(len(seen) - 1, len(PLANTED) - 1)]}
    return measure


def test_best_by_tau_ends_with_the_peak_weights(target, corpus, tmp_path):  # noqa: F811
    seen: list = []
    cfg = head_cfg(val_every=2, max_steps=12, best_by="tau", stop_when_flat=0)
    head, summary = train_head(target, corpus, cfg, tmp_path / "run", val_extra=planted_tau(seen))
    assert summary["best"]["step"] == 6 and summary["best"]["by"] == "chain_tau"
    final = trainable_state(head)
    for key, value in seen[2].items():  # the weights validated 3rd (step 6), not the last ones
        torch.testing.assert_close(final[key], value)
    assert any(not torch.equal(final[k], v) for k, v in seen[-1].items())
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in rows if r["split"] == "val"]
    assert all("chain_tau" in r and "top1" in r for r in val)


def test_best_by_last_keeps_the_last_weights(target, corpus, tmp_path):  # noqa: F811
    seen: list = []
    head, summary = train_head(target, corpus, head_cfg(val_every=2, max_steps=8), tmp_path / "run",
                               val_extra=planted_tau(seen))
    assert "best" not in summary and not (tmp_path / "run" / "best.pt").exists()
    for key, value in seen[-1].items():
        torch.testing.assert_close(trainable_state(head)[key], value)


def test_the_flat_stop_follows_tau(target, corpus, tmp_path):  # noqa: F811
    seen: list = []
    cfg = head_cfg(val_every=2, max_steps=40, best_by="tau", stop_when_flat=2, flat_gain=0.05)
    _, summary = train_head(target, corpus, cfg, tmp_path / "run", val_extra=planted_tau(seen))
    assert summary["flat"] and summary["step"] == 10  # 1.5, 1.4 after the 1.9 peak: flat at the 5th validation
    assert summary["curve"] == PLANTED[:5]


def test_bad_best_by_is_one_line():
    with pytest.raises(ValueError, match="best_by"):
        best_measure("accuracy")
    assert best_measure("loss") == ("loss", -1.0) and best_measure(None) is None


def test_learning_curve_draws_tau_beside_top1(tmp_path):
    from analysis.learning_curve import plot_curves

    rows = [{"step": s, "tokens_trained": 100 * s, "top1": 0.1 * s, "chain_tau": t, "split": "val"}
            for s, t in zip(range(1, 7), PLANTED)]
    drawn = plot_curves({"run": rows}, tmp_path / "c.png")
    assert drawn.exists()
    import analysis.learning_curve as lc

    assert lc.tau_lines({"run": rows}) == {"run": ([1, 2, 3, 4, 5, 6], PLANTED, 3)}


def test_each_member_of_a_joint_run_ends_at_its_own_best_validation(tmp_path):
    """Two heads validated together: the primary peaks at the second validation, the other member at the first;
    the restored module holds each at its own peak (a member without its own measure: the primary's step)."""
    from eagle2.training.best import BestCheckpoint
    from eagle2.training.objectives.joint import JointHeads

    torch.manual_seed(0)
    module = JointHeads({"a": torch.nn.Linear(3, 3), "b": torch.nn.Linear(3, 3), "c": torch.nn.Linear(3, 3)},
                        primary="a")
    best = BestCheckpoint("tau", tmp_path)
    for step, (tau_a, tau_b) in enumerate([(1.0, 2.0), (1.5, 1.0), (1.2, 1.5)], start=1):
        with torch.no_grad():
            for head in module.heads.values():
                head.weight.fill_(float(step))
        best.value({"chain_tau": tau_a, "a/chain_tau": tau_a, "b/chain_tau": tau_b}, module, step)
    kept = best.restore(module, "cpu")
    assert kept["step"] == 2 and kept["members"] == {"a": {"step": 2, "value": 1.5}, "b": {"step": 1, "value": 2.0}}
    assert module.heads["a"].weight.eq(2.0).all()
    assert module.heads["b"].weight.eq(1.0).all()  # its own peak, not the primary's
    assert module.heads["c"].weight.eq(2.0).all()  # no measure of its own: the primary's best step
