"""The learning curve of head training: val rows carry the tokens trained and passes over the corpus, the
flat-curve stop (``curve_flat``: the best of the last ``stop_when_flat`` validations gained < ``flat_gain`` on
the best before them) ends a run
and survives a resume, and ``analysis.learning_curve`` draws the rows."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from analysis.learning_curve import plot_curves, validation_rows
from eagle2.training.loop import curve_flat
from eagle2.training.objectives.eagle import train_head
from tests.test_training import corpus, head_cfg, target  # noqa: F401  (fixtures)


def test_curve_flat_by_hand():
    assert not curve_flat([0.1, 0.2, 0.3, 0.4], evals=3, min_gain=0.005)  # still rising
    assert curve_flat([0.1, 0.3, 0.302, 0.301, 0.304], evals=3, min_gain=0.005)  # +0.002, -0.001, +0.002
    assert not curve_flat([0.1, 0.3, 0.302, 0.301, 0.31], evals=3, min_gain=0.005)  # the last one gained 0.008
    assert not curve_flat([0.3, 0.3, 0.3], evals=3, min_gain=0.005)  # needs evals + 1 validations
    assert not curve_flat([0.3, 0.3, 0.3, 0.3], evals=0, min_gain=0.005)  # 0 = never stop


def test_a_curve_rising_slowly_at_every_validation_is_not_flat():
    """The joint run's EAGLE-3 curve, steps 2,500-3,600: each validation gained < 0.005 on the best before it,
    but the window of 10 (~4M tokens) gained 0.023: not flat (a rule over single validations stopped it)."""
    curve = [0.4296, 0.4352, 0.4351, 0.4383, 0.4429, 0.4429, 0.4470, 0.4507, 0.4518, 0.4524, 0.4555, 0.4586]
    assert all(curve[i] - max(curve[:i]) < 0.005 for i in range(2, len(curve)))  # each step of it is small
    assert not curve_flat(curve, evals=10, min_gain=0.005)
    assert curve_flat(curve[:2] + [0.4352 + 0.0004 * i for i in range(10)], evals=10, min_gain=0.005)


def test_flat_curve_stops_training_and_the_rows_draw(target, corpus, tmp_path):  # noqa: F811
    cfg = head_cfg(epochs=8, val_every=2, stop_when_flat=2, flat_gain=1.0)  # any gain < 1: flat at the 3rd
    head, summary = train_head(target, corpus, cfg, tmp_path / "run")
    assert summary["flat"] and summary["stopped"] and summary["step"] == 6 < summary["total_steps"]
    assert not summary["partial"]  # a flat stop is a finished run: the recipe exports it
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


def test_validation_on_another_set_with_chain_tau(target, corpus, tmp_path):  # noqa: F811
    """``val_set: mtbench``'s mechanism: given sequences replace the held-out shards as the validation set
    (the curve is theirs) and ``chain_tau_measure`` adds the greedy-chain tau of the head being trained,
    equal to the eval stage's on the trained head."""
    from functools import partial

    from eagle2.training.data import all_sequences
    from eagle2.training.evaluation.evaluate import chain_acceptance, chain_tau_measure
    from eagle2.training.objectives.eagle import head_chain, head_chain_of
    from eagle2.training.support.losses import LossProjection

    others = all_sequences(corpus)[:3]  # a set the corpus split would not pick as held out
    ev = OmegaConf.create({"depth": 3, "stride": 2, "max_anchors_per_sequence": 8})
    cfg = head_cfg(epochs=1, val_every=2)
    head, summary = train_head(target, corpus, cfg, tmp_path / "run", val_seqs=others,
                               val_extra=chain_tau_measure(head_chain_of, target, others, ev))
    rows = validation_rows(tmp_path / "run")
    assert rows and all("chain_tau" in r and 1.0 <= r["chain_tau"] <= 1 + ev.depth for r in rows)
    _, plain = train_head(target, corpus, cfg, tmp_path / "plain")  # the same run on the held-out shards
    assert summary["curve"] != plain["curve"]  # the curve is read off the given set
    proj = LossProjection(target.get_output_embeddings(), torch.float32)
    with torch.no_grad():
        again = chain_acceptance(partial(head_chain, head, proj), others, depth=3, stride=2, max_anchors_per_sequence=8)
    assert abs(rows[-1]["chain_tau"] - again["tau"]) < 1e-6


def test_a_validation_schedule_is_the_curve(target, corpus, tmp_path):  # noqa: F811
    """With ``val_every`` set, epoch ends add no validation of their own (one a step after a scheduled one
    was a near-duplicate point that the flat-curve stop counted); a ``stop_after`` run is partial."""
    cfg = head_cfg(epochs=3, val_every=3)
    _, summary = train_head(target, corpus, cfg, tmp_path / "run")
    steps = [r["step"] for r in validation_rows(tmp_path / "run")]
    assert summary["total_steps"] == 12  # 4 steps per epoch: epoch ends at 4 and 8 are off the schedule
    assert steps == [3, 6, 9, 12]
    _, cut = train_head(target, corpus, cfg, tmp_path / "cut", stop_after=2)
    assert cut["partial"] and cut["stopped"] and not cut["flat"]


def test_legs_join_and_the_scaling_points_are_the_nearest_validations():
    from analysis.learning_curve import joined_legs, scaling_points

    first = [{"step": 50, "tokens_trained": 100, "top1": 0.1}, {"step": 100, "tokens_trained": 200, "top1": 0.2}]
    second = [{"step": 50, "tokens_trained": 100, "top1": 0.3}, {"step": 100, "tokens_trained": 210, "top1": 0.4},
              {"step": 150, "tokens_trained": 600, "top1": 0.5}]
    rows = joined_legs([first, second])
    assert [(r["step"], r["tokens_trained"]) for r in rows] == [(50, 100), (100, 200), (150, 300), (200, 410),
                                                                (250, 800)]
    # 1/4 of 800 = 200 (exact), 1/2 = 400 (nearest: 410), all = 800
    assert scaling_points(rows) == [(0.25, 200, 0.2), (0.5, 410, 0.4), (1.0, 800, 0.5)]


def test_shipped_logs_are_read_gzipped(tmp_path):
    """A shipped head folder keeps its log as ``metrics.jsonl.gz``: the curve reads it as the plain file."""
    import gzip
    import json

    rows = [{"split": "val", "step": 5, "top1": 0.3, "tokens_trained": 100},
            {"split": "train", "step": 5, "loss": 1.0, "cpu_kind": "avx2"}]
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "zipped").mkdir()
    plain = (tmp_path / "plain" / "metrics.jsonl").read_bytes()
    (tmp_path / "zipped" / "metrics.jsonl.gz").write_bytes(gzip.compress(plain))
    assert validation_rows(tmp_path / "zipped") == validation_rows(tmp_path / "plain") == rows[:1]
    assert validation_rows(tmp_path / "zipped" / "metrics.jsonl.gz") == rows[:1]


def test_a_joint_run_draws_each_head_by_its_field(tmp_path):
    """``RUN@FIELD`` draws one head of a joint run (its stats logged as ``eagle3/top1``, ``head/top1``)."""
    import json

    from analysis.learning_curve import run_rows

    rows = [{"split": "val", "step": s, "tokens_trained": 100 * s, "head/top1": 0.4, "eagle3/top1": 0.3 + s / 100}
            for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert [r["top1"] for r in run_rows(f"{tmp_path}@eagle3/top1", "top1")] == [0.31, 0.32]
    assert [r["top1"] for r in run_rows(f"{tmp_path}@head/top1", "top1")] == [0.4, 0.4]
    assert all("top1" not in r for r in run_rows(str(tmp_path), "top1"))


def test_tau_along_a_run_is_a_third_panel_and_the_turns_average_per_method(tmp_path):
    """``tau_along_run`` averages each method's turns (and pools their tokens over their forwards); the curve's
    third panel draws the snapshots' tau against the tokens trained, the shipped heads as dashed lines."""
    import json

    import matplotlib.pyplot as plt

    from analysis.learning_curve import plot_tau, tau_table
    from eagle2.results.frames import load_rows
    from experiments.research.tau_along_run import tau_by_method

    common = {"status": "ok", "model": "smollm2", "dataset": "mt_bench", "temperature": 0.0, "config_hash": "c"}
    rows = [{**common, "method": "eagle3", "question_id": 1, "turn": t, "tau": tau, "accept_lengths": acc,
             "target_forwards": len(acc)} for t, tau, acc in ((0, 2.0, [2, 2]), (1, 1.5, [1, 2]))]
    rows.append({**common, "method": "eagle2", "question_id": 1, "turn": 0, "tau": 3.0, "accept_lengths": [3],
                 "target_forwards": 1})
    (tmp_path / "mt_bench").mkdir()
    (tmp_path / "mt_bench" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    taus = tau_by_method(load_rows(tmp_path))
    assert taus["eagle3"] == {"turns": 2, "tau": 1.75, "tau_sem": 0.25, "tau_pooled": 1.75}
    assert taus["eagle2"] == {"turns": 1, "tau": 3.0, "tau_sem": None, "tau_pooled": 3.0}

    protocol = {"questions": 10, "max_new_tokens": 128, "total_tokens": 16}
    log = [{"heads": "shipped", "tokens_trained": None, "eagle3_tau": 1.7, "eagle2_tau": 2.0, **protocol},
           {"heads": "snapshot", "tokens_trained": 3e6, "eagle3_tau": 1.9, "eagle2_tau": 2.1, **protocol},
           {"heads": "snapshot", "tokens_trained": 2e6, "eagle3_tau": 1.8, "eagle2_tau": 1.9, **protocol},
           {"heads": "snapshot", "tokens_trained": 4e6, "eagle3_tau": 9.0, "eagle2_tau": 8.0,
            **protocol, "questions": 40}]  # another protocol: its own line style
    fig, ax = plt.subplots()
    plot_tau(ax, log)
    solid = [line for line in ax.lines if line.get_linestyle() == "-"]
    dashed = [line for line in ax.lines if line.get_linestyle() == "--"]
    dotted = [line for line in ax.lines if line.get_linestyle() == ":"]
    assert [list(line.get_xdata()) for line in solid] == [[2.0, 3.0], [2.0, 3.0]]  # ordered by tokens trained
    assert [list(line.get_ydata()) for line in solid] == [[1.8, 1.9], [1.9, 2.1]]
    assert sorted(line.get_ydata()[0] for line in dashed) == [1.7, 2.0]
    assert [list(line.get_ydata()) for line in dotted] == [[9.0], [8.0]]  # the 40 questions, not mixed in
    assert "128 tok, 16-token tree" in ax.get_title()  # shared by both protocols
    plt.close(fig)
    fig, ax = plt.subplots()  # a protocol with another tree: the title cannot name one tree, the legend does
    plot_tau(ax, [*log, {**log[1], "total_tokens": 60}, {**log[1], "questions": 80}, {**log[1], "questions": 5}])
    labels = [line.get_label() for line in ax.lines]
    assert "tree" not in ax.get_title() and "EAGLE-3, 10 q, 128 tok, 60-token tree" in labels
    assert sum(label.startswith("EAGLE-3") for label in labels) == 5  # past the third style, none dropped
    plt.close(fig)
    pooled = [{**r, "step": 7, "eagle3_tau_pooled": r["eagle3_tau"], "eagle2_tau_pooled": 2.05, "eagle3_tau_sem": 0.1}
              for r in log]
    table = tau_table(pooled).splitlines()
    assert table[3] == "| snapshot | 7 | 3.00M | 10 | 1.90 +- 0.10 (1.90) | 2.10 (2.05) |" and len(table) == 6


def test_a_run_killed_inside_a_validation_takes_it_when_resumed(target, corpus, tmp_path, monkeypatch):  # noqa: F811
    """The checkpoint of a validation step is written before its validation: a kill in between leaves a
    checkpoint without that point of the curve. The resumed run validates that step first, so its curve and
    rows are the uninterrupted run's."""
    import json

    import pytest

    from eagle2.training.loop import Trainer

    cfg = head_cfg(epochs=2, val_every=2)
    _, ref = train_head(target, corpus, cfg, tmp_path / "ref")
    real = Trainer.validate

    def killed_at_step_4(self):
        if self.step == 4:
            raise KeyboardInterrupt  # the kill lands inside step 4's validation
        return real(self)

    monkeypatch.setattr(Trainer, "validate", killed_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        train_head(target, corpus, cfg, tmp_path / "cut")
    monkeypatch.setattr(Trainer, "validate", real)
    _, resumed = train_head(target, corpus, cfg, tmp_path / "cut")

    def val_steps(run):
        return [r["step"] for r in map(json.loads, (tmp_path / run / "metrics.jsonl").read_text().splitlines())
                if r["split"] == "val"]

    assert len(ref["curve"]) >= 3 and resumed["curve"] == ref["curve"]
    assert val_steps("cut") == val_steps("ref")


def test_tau_along_run_in_parallel_decodes_each_method_once_in_its_own_process(tmp_path):
    """``--parallel`` splits the multirun into one ``run.py`` a method, with the same settings; without it,
    one ``run.py`` decodes both."""
    from experiments.research.tau_along_run import METHODS, decode_commands

    heads = {"eagle3": tmp_path / "e3", "head": tmp_path / "e2"}
    one = decode_commands(heads, tmp_path / "r", 40, 128, 16)
    split = decode_commands(heads, tmp_path / "r", 40, 128, 16, parallel=True)
    assert len(one) == 1 and f"method={','.join(METHODS)}" in one[0]
    assert sorted(arg for command in split for arg in command if arg.startswith("method=")) == \
        sorted(f"method={m}" for m in METHODS)
    settings = [{arg for arg in command if not arg.startswith(("method=", "hydra.sweep.dir="))}
                for command in one + split]
    assert settings[0] == settings[1] == settings[2]
    sweeps = {arg for command in split for arg in command if arg.startswith("hydra.sweep.dir=")}
    assert len(sweeps) == len(split)  # two processes started in the same second: not one sweep folder
