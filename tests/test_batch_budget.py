"""The cost-model budget at batch size B (``method.total_tokens=auto`` under batched decoding): the profile
holds ``T_B(q)``, one forward over B rows of q tree tokens, a round costs ``B / draft_rows * T_draft + T_B(m + 1)``
(``draft_rows``: the rows one profiled drafting round covers, B when they draft together), and a drafter built
for a batch of B reads the B-row profile (the batched runner asks for it)."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

import eagle2.bench.cost_profile as cp
import eagle2.core.engine as engine
import eagle2.drafters.budget as budget
from eagle2.bench.methods import build_drafter
from eagle2.core.sampling import SamplingParams
from tests.conftest import tiny_head, tiny_llama


@pytest.fixture(scope="module")
def tiny():
    target = tiny_llama(vocab=16, layers=2, seed=0, scale=10.0)
    return target, tiny_head(target, seed=2)


def test_batched_round_cost_counts_every_rows_draft():
    values = torch.tensor([0.9, 0.6, 0.5, 0.4])
    one = budget.CostProfile([1.0, 1.0, 1.0, 1.0, 1.0], [0.5] * 3, 16, {})  # batch 1: verification is flat
    four = budget.CostProfile([1.0, 2.0, 3.0, 4.0, 5.0], [0.5] * 3, 16, {}, rows=4)  # T_4(q) grows with q
    assert budget.best_budget(values, one, 3)[0] == 4
    m, expected, seconds = budget.best_budget(values, four, 3)
    rates = [(1 + float(values[:k].sum())) / (4 * 0.5 + (k + 1)) for k in range(1, 5)]
    assert m == 1 + rates.index(max(rates)) == 2
    assert seconds == pytest.approx(4 * 0.5 + 3.0) and expected == pytest.approx(2.5)


def test_rows_drafting_together_pay_one_draft():
    values = torch.tensor([0.9, 0.6, 0.5, 0.4])
    together = budget.CostProfile([1.0, 2.0, 3.0, 4.0, 5.0], [2.0] * 3, 16, {}, rows=4, draft_rows=4)
    alone = budget.CostProfile([1.0, 2.0, 3.0, 4.0, 5.0], [0.5] * 3, 16, {}, rows=4)
    assert budget.best_budget(values, together, 3) == budget.best_budget(values, alone, 3)  # 4 x 0.5 == 2.0
    cheap = budget.CostProfile([1.0, 2.0, 3.0, 4.0, 5.0], [0.5] * 3, 16, {}, rows=4, draft_rows=4)
    m, _, seconds = budget.best_budget(values, cheap, 3)
    assert seconds == pytest.approx(0.5 + m + 1)


def test_old_profile_files_read_as_batch_one():
    prof = budget.CostProfile(**{"verify_s": [1.0], "draft_s": [0.1], "context": 8, "meta": {}})
    assert prof.rows == 1 and prof.draft_rows == 1


def test_batched_verify_profile_is_its_own_measurement(tiny, tmp_path):
    target, head = tiny
    args = ({"lm_head_dtype": None, "vocab": None}, 2, 2, 8, 6)
    assert cp.profile_key(target, head, *args, rows=1) == cp.profile_key(target, head, *args)  # old keys kept
    assert cp.profile_key(target, head, *args, rows=4) != cp.profile_key(target, head, *args)
    times = cp.measure_verify(target, context=8, max_q=3, reps=1, rows=4)
    assert len(times) == 3 and all(t > 0 for t in times)
    calls = []

    def spy(fn, reps, device, q):  # what one timed verify does: B rows, q tokens each, after B contexts
        fn()
        calls.append(q)
        return 100.0 if len(calls) == 1 else float(q)  # a burst of load in the first timing: outvoted

    real = cp.forward_target
    shapes = []
    cp.forward_target = lambda model, ids, cache, **kw: shapes.append(tuple(ids.shape)) or real(model, ids, cache, **kw)
    try:
        assert cp.measure_verify(target, context=8, max_q=3, reps=1, rows=4, timer=spy) == [1.0, 2.0, 3.0]
    finally:
        cp.forward_target = real
    assert shapes[0] == (4, 8) and set(shapes[1:]) == {(4, 1), (4, 2), (4, 3)}
    assert calls == [1, 2, 3, 3, 2, 1, 1, 2, 3]  # the small trees in three sweeps of alternating order


def test_small_trees_are_timed_interleaved_so_a_slow_spell_keeps_their_ratios(tiny):
    """A shared machine at half speed for a spell at the start of the measurement: T(q) / T(1) must stay q, the
    ratio the round policy weighs (timed in passes of one q after another, the spell fell on most of T(3)'s)."""
    target, _ = tiny
    calls = []

    def slow_spell(fn, reps, device, q):  # a true T(q) of q; the first 4 timings twice as long
        calls.append(q)
        return float(q) * (2.0 if len(calls) <= 4 else 1.0)

    times = cp.measure_verify(target, context=8, max_q=3, reps=2, rows=2, timer=slow_spell)
    assert [t / times[0] for t in times] == [1.0, 2.0, 3.0]
    assert len(calls) == 18  # 2 reps x 3 sweeps, one timing of each small tree per sweep


def _write_profile(tmp_path, target, head, rows, verify):
    key = cp.profile_key(target, head, {"lm_head_dtype": None, "vocab": None}, 3, 4, 256, 9, rows)
    (tmp_path / f"{key}.json").write_text(json.dumps(
        {"verify_s": verify, "draft_s": [0.01] * 3, "context": 256, "meta": {}, "rows": rows}))


def test_drafter_for_a_batch_reads_the_batch_profile(tiny, tmp_path, monkeypatch):
    target, head = tiny
    monkeypatch.setattr(cp, "_loaded", {})
    monkeypatch.setattr(cp, "probe_t1", lambda *a, **k: (1.0, 0.0))  # the planted T(1): they are used as they are
    _write_profile(tmp_path, target, head, 1, [1.0] * 9)  # batch 1: every node is free
    _write_profile(tmp_path, target, head, 4, [1.0, 2.0] + [50.0 * q for q in range(3, 10)])  # batch 4: one node
    method = {"name": "eagle2", "depth": 3, "top_k": 4, "total_tokens": "auto", "max_total_tokens": 8,
              "profile_dir": str(tmp_path)}
    one = build_drafter(OmegaConf.create(method), target, SamplingParams(), None, head=head)
    four = build_drafter(OmegaConf.create({**method, "verify_rows": 4}), target, SamplingParams(), None, head=head)
    assert (one.profile.rows, four.profile.rows) == (1, 4)
    for drafter, want in ((one, 8), (four, 1)):
        out = engine.generate(target, drafter, [2, 5, 3], SamplingParams(), 12, set())
        assert {r.record()["budget"] for r in out.rounds} == {want}


def test_batched_runner_asks_for_the_batch_profile(tmp_path, monkeypatch, smollm2):
    """run.py at batch_size=2 with an auto budget builds every drafter from the 2-row profile."""
    from eagle2.bench.runner import run
    from tests.test_runner import config

    asked = []

    def fake_profile(*args, rows=1, draft_rows=1, **kwargs):
        asked.append((rows, draft_rows))
        return budget.CostProfile([0.01 * q for q in range(1, 40)], [0.01] * 8, 256, {}, rows=rows,
                                  draft_rows=draft_rows)

    monkeypatch.setattr(cp, "get_profile", fake_profile)
    for drafting, want in (("true", (2, 2)), ("false", (2, 1))):
        asked.clear()
        run(config("method=eagle2", "method.total_tokens=auto", "dataset=mt_bench", "dataset.limit=2",
                   "max_new_tokens=4", "batch_size=2", f"batch_drafting={drafting}", "model.dtype=float32",
                   f"paths.results={tmp_path / drafting}"))
        assert asked and set(asked) == {want}


def test_batched_draft_profile_times_the_rows_together(tiny, monkeypatch):
    """``draft_rows`` > 1: one drafting round of the profile is one ``propose_batch`` over that many rows."""
    target, head = tiny
    from eagle2.drafters.eagle2_dynamic import Eagle2Drafter

    calls = []
    real = Eagle2Drafter.propose_batch.__func__
    monkeypatch.setattr(Eagle2Drafter, "propose_batch",
                        classmethod(lambda cls, drafters, *a: calls.append(len(drafters)) or real(cls, drafters, *a)))
    method = OmegaConf.create({"name": "eagle2", "depth": 2, "top_k": 2, "total_tokens": 1})
    make = lambda d: build_drafter(OmegaConf.merge(method, {"depth": d}), target, SamplingParams(), None, head=head)  # noqa: E731
    times = cp.measure_draft(target, head, make, depth=2, context=8, reps=1, rows=3)
    assert len(times) == 2 and all(t > 0 for t in times) and set(calls) == {3}


def test_the_catch_up_profile_times_rounds_that_feed_a_backlog(tiny, monkeypatch):
    """``measure_catch_up``: every timed round's rows each feed ``CATCH_UP_PAIRS`` pending positions, together."""
    target, head = tiny
    from eagle2.drafters.eagle2_dynamic import Eagle2Drafter

    backlogs = []
    real = Eagle2Drafter.propose_batch.__func__
    spy = lambda cls, drafters, *a: backlogs.append([len(d.pending_tokens) for d in drafters]) or real(cls, drafters, *a)  # noqa: E731,E501
    monkeypatch.setattr(Eagle2Drafter, "propose_batch", classmethod(spy))
    method = OmegaConf.create({"name": "eagle2", "depth": 1, "top_k": 2, "total_tokens": 1})
    make = lambda d: build_drafter(OmegaConf.merge(method, {"depth": d}), target, SamplingParams(), None, head=head)  # noqa: E731
    per_pair = cp.measure_catch_up(target, head, make, context=40, reps=2, rows=3, one_pair_s=0.0)
    assert per_pair > 0 and len(backlogs) == 4  # one untimed round, median_time's warm-up, two timed
    assert backlogs[1:] == [[cp.CATCH_UP_PAIRS] * 3] * 3
