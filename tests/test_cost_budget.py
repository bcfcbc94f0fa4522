"""The cost-model budget (``method.total_tokens=auto``): the choice rule, the cached profile, and what
a run records per round."""

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
from eagle2.drafters.eagle2_dynamic import Eagle2Drafter
from tests.conftest import tiny_head, tiny_llama


def profile(verify, draft=0.0):
    return budget.CostProfile(list(verify), [draft] * 3, context=16, meta={})


def brute_force(values, prof, depth):
    best, best_m = -1.0, 0
    for m in range(1, len(values) + 1):
        rate = (1 + sum(values[:m])) / (prof.draft(depth) + prof.verify(m + 1))
        if rate > best:
            best, best_m = rate, m
    return best_m


@pytest.mark.parametrize("verify,draft,values,want", [
    ([1.0] * 8, 0.0, [0.9, 0.5, 0.1, 0.01], 4),             # free verification: every node pays
    ([1.0, 2.0, 3.0, 4.0, 5.0], 0.0, [0.9, 0.1, 0.05], 1),   # cost linear in q: only the sure node
    ([1.0, 1.1, 1.2, 3.0, 3.1, 3.2], 0.5, [0.8, 0.6, 0.5, 0.4, 0.3], 2),  # a cliff after 3 tokens
])
def test_best_budget_maximises_expected_rate(verify, draft, values, want):
    prof = profile(verify, draft)
    m, expected, seconds = budget.best_budget(torch.tensor(values), prof, depth=3)
    assert m == want == brute_force(values, prof, 3)
    assert expected == pytest.approx(1 + sum(values[:m]))
    assert seconds == pytest.approx(draft + verify[m])


def test_monotone_pools_violators():
    assert cp.monotone([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert cp.monotone([5.0, 1.0, 1.0]) == pytest.approx([7 / 3] * 3)
    assert cp.monotone([1.0, 2.0]) == [1.0, 2.0]


def test_one_timing_taken_under_load_does_not_flatten_the_verify_curve():
    """A spike at q=2 (another process held the core for that timing) left raw; plain pooling made
    T(2..25) one flat value and the budget always the largest (a measured profile did)."""
    raw = [0.09 + 0.01 * q for q in range(1, 26)]
    raw[1] = 5.0
    curve = cp.verify_curve(raw)
    assert curve == sorted(curve)
    assert curve[4:-2] == pytest.approx(raw[4:-2])  # beyond the spike's window: the measured curve
    assert curve[1] < 0.2 and curve[-1] / curve[2] > 2  # neither the spike nor a flat plateau


def test_a_rising_curve_keeps_its_ends_and_loses_an_end_spike():
    """A window clipped at q=1 raised T(1) to about T(2) on a steep (batched) curve: a measured 8-row profile
    went 29.0 -> 34.3 ms, and every node looked cheaper than it is."""
    raw = [0.029 + 0.005 * q for q in range(25)]
    assert cp.verify_curve(raw) == pytest.approx(raw)
    spiked = [1.0] + raw[1:-1] + [9.0]  # a spike at each end
    curve = cp.verify_curve(spiked)
    assert curve[0] <= raw[2] and curve[-1] < raw[-1] * 1.05  # gone: the ends among their neighbours


def test_verify_cost_extrapolates_past_the_measured_range():
    prof = profile([1.0, 2.0, 4.0])
    assert prof.verify(3) == 4.0 and prof.verify(5) == 8.0


@pytest.fixture(scope="module")
def tiny():
    target = tiny_llama(vocab=16, layers=2, seed=0, scale=10.0)
    return target, tiny_head(target, seed=2)


def _profile(target, head, **settings):
    """The cost profile of ``target`` + ``head`` with an EAGLE-2 drafter of top-k 2."""
    def make_drafter(d):
        return Eagle2Drafter(head, target.lm_head, target.device, depth=d, top_k=2, total_tokens=1)

    return cp.get_profile(target, head, {}, make_drafter, **settings)


def test_profile_is_measured_once_then_read_from_disk(tiny, tmp_path, monkeypatch, steady_timings):
    target, head = tiny
    prof = _profile(target, head, depth=2, top_k=2, profile_dir=tmp_path, max_q=6, reps=1, context=8)
    assert len(prof.verify_s) == 6 and len(prof.draft_s) == 2 and all(t > 0 for t in prof.verify_s + prof.draft_s)
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["verify_s"] == prof.verify_s
    monkeypatch.setattr(cp, "_loaded", {})  # a new process: the file is read, nothing measured but the probe
    monkeypatch.setattr(cp, "probe_t1", lambda *a, **k: (prof.verify_s[0], 0.0))  # a probe that agrees

    def no_measuring(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(cp, "measure_verify", no_measuring)
    again = _profile(target, head, depth=2, top_k=2, profile_dir=tmp_path, max_q=6, reps=1, context=8)
    assert again.verify_s == prof.verify_s
    other = tmp_path / "other"  # other settings: another profile
    with pytest.raises(AssertionError, match="measured again"):
        _profile(target, head, depth=3, top_k=2, profile_dir=other, max_q=6, reps=1, context=8)


def test_reprofile_measures_again(tiny, tmp_path, monkeypatch, steady_timings):
    target, head = tiny
    _profile(target, head, depth=2, top_k=2, profile_dir=tmp_path, max_q=4, reps=1, context=8)
    monkeypatch.setattr(cp, "_loaded", {})
    calls = []
    real = cp.measure_verify
    monkeypatch.setattr(cp, "measure_verify", lambda *a, **k: calls.append(k["max_q"]) or real(*a, **k))
    _profile(target, head, depth=2, top_k=2, profile_dir=tmp_path, max_q=4, reps=1, context=8,
                   remeasure=True)
    assert [q for q in calls if q > 1] == [4]  # the curve once (besides the one-token probe)


@pytest.mark.parametrize("stale", ['{"verify_s": [1.0], "draft_s": [], "context": 8, "meta": {}, "schema": 9}',
                                   '{"verify_s": [1.0', ""])
def test_an_unreadable_cached_profile_is_measured_again(tiny, tmp_path, monkeypatch, stale, steady_timings):
    """A cached profile in another version's format (an unknown field), torn or empty is measured again
    and rewritten, not a crash."""
    target, head = tiny
    monkeypatch.setattr(cp, "_loaded", {})
    prof = _profile(target, head, depth=2, top_k=2, profile_dir=tmp_path, max_q=4, reps=1, context=8)
    (path,) = tmp_path.glob("*.json")
    path.write_text(stale)
    monkeypatch.setattr(cp, "_loaded", {})
    again = _profile(target, head, depth=2, top_k=2, profile_dir=tmp_path, max_q=4, reps=1, context=8)
    assert len(again.verify_s) == len(prof.verify_s) == 4
    assert json.loads(path.read_text())["verify_s"] == again.verify_s


def test_auto_budget_is_recorded_per_round(tiny, tmp_path, monkeypatch):
    target, head = tiny
    monkeypatch.setattr(cp, "probe_t1", lambda *a, **k: (1.0, 0.0))  # the planted T(1): it is used as it is
    # a profile where verifying more than 3 tokens is very expensive: the budget must stay <= 2
    key = cp.profile_key(target, head, {"lm_head_dtype": None, "vocab": None}, 3, 4, 256, 9)
    (tmp_path / f"{key}.json").write_text(json.dumps(
        {"verify_s": [1.0, 1.01, 1.02] + [50.0] * 6, "draft_s": [0.1] * 3, "context": 256, "meta": {}}))
    method = OmegaConf.create({"name": "eagle2", "depth": 3, "top_k": 4, "total_tokens": "auto",
                               "max_total_tokens": 8, "profile_dir": str(tmp_path)})
    drafter = build_drafter(method, target, SamplingParams(), None, head=head)
    out = engine.generate(target, drafter, [2, 5, 3], SamplingParams(), 30, set())
    rounds = [r.record() for r in out.rounds]
    assert rounds and all(r["budget_mode"] == "auto" and 1 <= r["budget"] <= 2 for r in rounds)
    assert all(r["tree_size"] == r["budget"] + 1 for r in rounds)
    nodes = {k: torch.tensor(v, dtype=torch.float64) for k, v in out.nodes.items()}
    for i, r in enumerate(rounds):  # expected tokens = 1 + the path values of the verified nodes
        kept = (nodes["round"] == i) & (nodes["tree_index"] > 0)
        assert r["expected_tokens"] == pytest.approx(1 + float(nodes["value"][kept].sum()))
        assert r["predicted_round_s"] == pytest.approx(0.1 + [1.0, 1.01, 1.02][r["budget"]])


def test_bad_total_tokens_is_a_clear_error(tiny):
    target, head = tiny
    method = OmegaConf.create({"name": "eagle2", "depth": 3, "top_k": 4, "total_tokens": "lots"})
    with pytest.raises(ValueError, match="positive integer or auto"):
        build_drafter(method, target, SamplingParams(), None, head=head)


def test_the_drafter_takes_the_harness_profile_and_runs_no_target_forward(tiny, tmp_path):
    """The cost profile is data handed to ``build``: building an auto-budget EAGLE-2 drafter runs no forward of
    the target (the harness, ``eagle2.bench.cost_profile``, measured it), and without one it is refused."""
    from eagle2.drafters import eagle2_dynamic

    target, head = tiny
    cfg = OmegaConf.create({"name": "eagle2", "depth": 2, "top_k": 2, "total_tokens": "auto", "max_total_tokens": 4})
    forwards = []
    handle = target.register_forward_hook(lambda *args: forwards.append(1))
    try:
        drafter = eagle2_dynamic.build(cfg, target, SamplingParams(), None, {"head": head, "cost_profile": profile(
            [1.0, 1.1, 1.2, 1.3, 1.4])})
        with pytest.raises(ValueError, match="cost profile the harness measures"):
            eagle2_dynamic.build(cfg, target, SamplingParams(), None, {"head": head})
    finally:
        handle.remove()
    assert drafter.profile.verify_s == [1.0, 1.1, 1.2, 1.3, 1.4] and forwards == []
    cfg.profile_dir = str(tmp_path)
    with_harness = build_drafter(cfg, target, SamplingParams(), None, head=head)  # the harness measures it
    assert len(with_harness.profile.verify_s) == 5 and len(list(tmp_path.glob("*.json"))) == 1


def test_rest_auto_budget_keeps_the_most_frequent_nodes_the_profile_pays_for(tiny, tmp_path, monkeypatch):
    """REST's ``num_draft=auto``: the harness measures a head-less profile (its own cached file), and each round
    keeps the m most frequent retrieved nodes (ancestor-closed) that the profile says pay; greedy output stays
    plain decoding's."""
    from tests.conftest import shared_rest_datastore
    from tests.test_greedy import decode

    target, _ = tiny
    monkeypatch.setattr(cp, "probe_t1", lambda *a, **k: (1.0, 0.0))
    key = cp.profile_key(target, None, {"method": "rest"}, 1, 0, 256, 17)
    (tmp_path / f"{key}.json").write_text(json.dumps(  # verifying more than 3 tokens is very expensive
        {"verify_s": [1.0, 1.01, 1.02] + [50.0] * 14, "draft_s": [0.01], "context": 256, "meta": {}}))
    method = {"name": "rest", "max_span": 16, "min_span": 1, "max_matches": 5000, "continuation": 10,
              "num_draft": "auto", "max_num_draft": 16, "profile_dir": str(tmp_path)}
    weights = {"rest_datastore": shared_rest_datastore(target)}
    drafter = build_drafter(OmegaConf.create(method), target, SamplingParams(), None, weights=weights)
    assert drafter.profile.verify_s[3] == 50.0 and drafter.settings.num_draft == 16  # the cached file, the cap
    out = engine.generate(target, drafter, [2, 5, 3], SamplingParams(), 40, set())
    rounds = [r.record() for r in out.rounds if r.record().get("budget_mode") == "auto"]
    assert rounds and all(1 <= r["tree_size"] - 1 <= 2 for r in rounds)  # the profile pays for 1-2 nodes
    fixed = decode(target, {**method, "num_draft": 16, "profile_dir": None}, [2, 5, 3], 40)
    assert out.output_ids == fixed.output_ids == decode(target, {"name": "plain"}, [2, 5, 3], 40).output_ids
    assert max(r.record()["tree_size"] for r in fixed.rounds) > 3  # without the budget it verifies more


def test_rest_best_budget_keeps_parents_of_tied_children():
    """A child as frequent as its parent: the kept set still holds the parent (count, then depth order)."""
    from eagle2.drafters.rest import RestDrafter, RestSettings

    drafter = RestDrafter(None, RestSettings(), profile([1.0, 1.0, 1.0, 50.0, 50.0]))
    paths, counts, meta = drafter._best_budget([(4,), (4, 7), (5,), (4, 7, 1)], [6, 6, 2, 1], total=8)
    assert paths == [(4,), (4, 7)] and counts == [6, 6] and meta["budget_mode"] == "auto"
