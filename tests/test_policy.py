"""Speculation that pays or steps aside (``method.policy=pays``, ``eagle2.drafters.policy``): the choice on planted
profiles and counts, the smaller tree, what rows record, and outputs unchanged (greedy, batch 1 and batched)."""

from __future__ import annotations

import math
import random
from collections import deque

import pytest
import torch
from omegaconf import OmegaConf

import eagle2.core.engine as engine
from eagle2.bench.methods import build_drafter
from eagle2.core.batch_engine import BatchEngine, BatchRequest
from eagle2.core.sampling import SamplingParams
from eagle2.core.tree import DraftTree
from eagle2.drafters import budget, policy
from eagle2.drafters.budget import CostProfile

GREEDY = SamplingParams()
PROMPT = [2, 5, 3, 7, 5, 3]


def flat(verify_s: float, draft_s: float, q: int = 16, rows: int = 1) -> CostProfile:
    """A profile where any tree up to ``q`` tokens verifies in ``verify_s`` and a drafting round costs ``draft_s``."""
    return CostProfile([verify_s] * q, [draft_s] * 3, 256, {"planted": True}, rows=rows, draft_rows=rows)


def known(tokens: float, size: float) -> policy.RowEstimate:
    return policy.RowEstimate(tokens=tokens, tree_size=size)


def test_plain_when_drafting_costs_more_than_it_gains():
    # drafting doubles the round (1 + 1 s) for 1.5 tokens: 0.75 tokens/s against plain's 1.0
    meta = policy.decide(flat(1.0, 1.0), [known(1.5, 6)], depth=3)
    assert meta["policy_choice"] == "plain"
    assert meta["policy_draft_tps"] == pytest.approx(0.75) and meta["policy_plain_tps"] == pytest.approx(1.0)


def test_draft_when_it_pays():
    meta = policy.decide(flat(1.0, 0.1), [known(3.0, 6)], depth=3)
    assert meta["policy_choice"] == "draft" and meta["policy_draft_tps"] == pytest.approx(3.0 / 1.1)


def test_the_verify_cost_of_the_tree_size_counts():
    """Verify cheap for 4 tokens, dear beyond: the same acceptance pays with small trees, not with large ones."""
    cliff = CostProfile([1.0] * 4 + [4.0] * 12, [0.1] * 3, 256, {})
    assert policy.decide(cliff, [known(2.0, 4)], depth=1)["policy_choice"] == "draft"
    assert policy.decide(cliff, [known(2.0, 9)], depth=1)["policy_choice"] == "plain"


def test_rows_verified_together_decide_together():
    """Four rows: drafting costs the batch's draft once plus the verify of the largest tree."""
    prof = flat(1.0, 1.0, rows=4)
    good, poor = known(3.0, 5), known(1.0, 5)
    meta = policy.decide(prof, [good, good, poor, poor], depth=1)  # 8 tokens / 2 s = 4.0 == plain's 4 / 1 s
    assert meta["policy_choice"] == "plain"  # a tie does not pay
    meta = policy.decide(prof, [good, good, good, poor], depth=1)  # 10 / 2 = 5.0 > 4.0
    assert meta["policy_choice"] == "draft" and meta["policy_draft_tps"] == pytest.approx(5.0)


def test_probe_bursts_first_then_at_doubling_gaps_while_drafting_does_not_pay():
    """Near break-even (drafting predicted at 1 / 1.01 of plain's rate, a burst costing 0.03 plain rounds: its
    least gap is 3) the gaps double."""
    row, prof, choices = policy.RowEstimate(), flat(1.0, 0.01), []
    for _ in range(40):
        choice = policy.decide(prof, [row], depth=1)["policy_choice"]
        choices.append(choice)
        if choice != "plain":
            row.learn(1, 4)  # each drafted round accepts nothing
    assert "draft" not in choices
    starts = burst_starts(choices)
    assert starts[0] == 0 and all(choices[i:i + policy.PROBE_ROUNDS] == ["probe"] * policy.PROBE_ROUNDS
                                  for i in starts)
    gaps = [b - a - policy.PROBE_ROUNDS for a, b in zip(starts, starts[1:])]
    assert gaps == [policy.FIRST_GAP * 2 ** i for i in range(len(gaps))] and len(gaps) >= 2


def refilled_batch(seed: int, lifetimes: tuple[int, int], rounds: int = 400) -> list[str]:
    """The choices of four rows verified together under a profile where drafting never pays (each drafted round
    appends one token at twice a plain round's cost), each row replaced by a new request after a seeded lifetime."""
    rng, prof = random.Random(seed), flat(1.0, 1.0)
    rows = [policy.RowEstimate() for _ in range(4)]
    left = [rng.randint(*lifetimes) for _ in rows]
    choices = []
    for _ in range(rounds):
        choices.append(policy.decide(prof, rows, depth=1)["policy_choice"])
        for i, row in enumerate(rows):
            if choices[-1] != "plain":
                row.learn(1, 4)  # each drafted round accepts nothing
            left[i] -= 1
            if left[i] == 0:
                rows[i], left[i] = policy.RowEstimate(), rng.randint(*lifetimes)
    return choices


def test_a_refilled_batch_probes_together_at_growing_gaps():
    """Four rows verified together, each replaced by a new request every 40-90 rounds, drafting never paying: the
    rows share their bursts (a row in a burst does not restart one for the others) and a new row starts from the
    group's estimate, so the gaps still grow and most rounds are plain (before the group's burst, the staggered
    rows restarted each other's bursts and every round was a probe)."""
    choices = refilled_batch(seed=0, lifetimes=(40, 90))
    assert "draft" not in choices
    assert choices[300:].count("probe") <= 2 * policy.PROBE_ROUNDS  # gaps of 64 by then
    assert choices.count("plain") > 0.85 * len(choices)


def test_row_turnover_keeps_the_groups_burst_schedule():
    """Requests shorter than the longest gap (20-40 rounds), four verified together, refilled one by one: a row that
    joins takes the group's plain streak too, so the group still probes on its schedule (else no row ever lives
    long enough to reach the gap, and one pessimistic burst would keep the batch plain for good)."""
    choices = refilled_batch(seed=1, lifetimes=(20, 40), rounds=1600)
    later = burst_starts(choices)[2:]  # after the first two bursts: at the least gap, whatever the turnover
    gap = policy.least_gap(flat(1.0, 1.0), [known(1.0, 4)] * 4, 1)
    assert len(later) >= 4 and all(b - a == policy.PROBE_ROUNDS + gap for a, b in zip(later, later[1:]))


def test_a_new_row_starts_from_its_groups_estimate():
    old, new = known(3.0, 5), policy.RowEstimate()
    old.gap = 32
    assert policy.decide(flat(1.0, 0.1), [old, new], depth=1)["policy_choice"] == "draft"
    assert (new.tokens, new.tree_size, new.gap, new.rounds) == (3.0, 5, policy.FIRST_GAP, 1)  # drafting resets gaps
    alone = policy.RowEstimate()
    assert policy.decide(flat(1.0, 0.1), [alone], depth=1)["policy_choice"] == "probe"  # no group: a burst


def burst_starts(choices: list[str]) -> list[int]:
    return [i for i, c in enumerate(choices) if c == "probe" and (i == 0 or choices[i - 1] == "plain")]


def never_paying(prof: CostProfile, appended: int, rounds: int) -> list[str]:
    """A row's choices over ``rounds`` rounds, each drafted round appending ``appended`` tokens."""
    row, choices = policy.RowEstimate(), []
    for _ in range(rounds):
        choices.append(policy.decide(prof, [row], depth=1)["policy_choice"])
        if choices[-1] != "plain":
            row.learn(appended, 4)
    return choices


@pytest.mark.parametrize("draft_s, appended", [(1.0, 1), (2.0, 2)])
def test_bursts_that_do_not_pay_wait_until_probing_is_a_small_share(draft_s, appended):
    """A drafting round costing two plain rounds and appending one token, or three and appending two: each drafted
    round loses one plain round's time beyond the tokens it appends, a burst three, so after two bursts (one burst's
    three rounds are too few to wait long on) the next waits 3 / PROBE_SHARE rounds."""
    choices = never_paying(flat(1.0, draft_s), appended, 500)
    want = math.ceil(policy.PROBE_ROUNDS * 1.0 / policy.PROBE_SHARE)
    second = policy.PROBE_ROUNDS + policy.FIRST_GAP
    assert policy.SURE_ROUNDS == 2 * policy.PROBE_ROUNDS
    assert want > policy.LAST_GAP and burst_starts(choices)[:3] == [0, second, second + policy.PROBE_ROUNDS + want]


def test_rows_verified_together_wait_long_after_one_burst():
    """Four rows verified together, drafting not paying: one burst gives them twelve drafted rounds together, past
    SURE_ROUNDS, so the next burst waits the least gap at once (one row alone needs two bursts)."""
    rows, prof, choices = [policy.RowEstimate() for _ in range(4)], flat(1.0, 1.0), []
    for _ in range(400):
        choices.append(policy.decide(prof, rows, depth=1)["policy_choice"])
        for row in rows:
            if choices[-1] != "plain":
                row.learn(1, 4)
    gap = policy.least_gap(prof, rows, 1)
    assert burst_starts(choices)[:2] == [0, policy.PROBE_ROUNDS + gap]


def test_the_catch_up_of_a_longer_gap_lengthens_the_gap():
    """The profile's catch-up (seconds per position each row feeds after the gap) is part of a burst's cost, and it
    grows with the gap: the least gap is the least fixed point, and where the catch-up alone costs more than
    PROBE_SHARE of a plain round, no gap is long enough (MAX_GAP)."""
    rows = [known(1.0, 4)]
    base = flat(1.0, 1.0)
    with_catch_up = CostProfile(base.verify_s, base.draft_s, 256, {}, catch_up_s=0.002)

    def fits(prof, gap):
        return policy.burst_cost(prof, rows, 1, gap) <= policy.PROBE_SHARE * gap * prof.verify(1)

    plain_gap, gap = policy.least_gap(base, rows, 1), policy.least_gap(with_catch_up, rows, 1)
    assert plain_gap == 300 and gap > plain_gap  # 3 + 0.002 (G - 1) <= 0.01 G
    assert fits(with_catch_up, gap) and not fits(with_catch_up, gap - 1)
    dear = CostProfile(base.verify_s, base.draft_s, 256, {}, catch_up_s=0.02)
    assert policy.least_gap(dear, rows, 1) == policy.MAX_GAP
    batched = CostProfile(base.verify_s, base.draft_s, 256, {}, rows=4, catch_up_s=0.002)  # rows catching up alone
    assert batched.round_catch_up(11) == pytest.approx(4 * 0.002 * 10)


def test_a_new_request_starts_from_the_runs_pooled_estimate():
    class Inner:  # proposes a 5-token tree, hears nothing
        def propose(self, root, room):
            return DraftTree.root_only(root)

        def observe(self, new_tokens, hidden):
            pass

    def choice(drafter):
        tree = drafter.propose(7, room=100)
        drafter.drafted_size = 5 if tree.meta["policy_choice"] != "plain" else None
        return tree.meta["policy_choice"]

    run_state: dict = {}
    first = policy.PolicyDrafter(Inner(), flat(1.0, 0.1), run_state=run_state)
    assert choice(first) == "probe"  # the run's first request: a burst
    first.observe([1, 2, 3], None)  # one drafted round: 3 tokens of a 5-token tree
    second = policy.PolicyDrafter(Inner(), flat(1.0, 0.1), run_state=run_state)
    assert choice(second) == "draft"  # 3 tokens / 1.1 s beat plain's 1 / 1 s
    assert (second.estimate.tokens, second.estimate.tree_size) == (3, 5)
    gloomy: dict = {"policy": known(0.5, 5)}  # the run's bursts found drafting far below plain
    third = policy.PolicyDrafter(Inner(), flat(1.0, 0.1), run_state=gloomy)
    choices = [choice(third) for _ in range(policy.FIRST_GAP + 1)]
    assert choices == ["plain"] * policy.FIRST_GAP + ["probe"]  # still a burst of its own, at the first gap
    alone = policy.PolicyDrafter(Inner(), flat(1.0, 0.1))  # no run state: a burst, as every request before
    assert choice(alone) == "probe"


def test_a_burst_that_finds_acceptance_back_drafts_and_resets_the_gap():
    row = known(1.0, 4)
    row.gap, row.plain_streak = 32, 32
    for _ in range(policy.PROBE_ROUNDS):
        assert policy.decide(flat(1.0, 0.1), [row], depth=1)["policy_choice"] == "probe"
        row.learn(10, 4)  # the burst finds acceptance back
    assert policy.decide(flat(1.0, 0.1), [row], depth=1)["policy_choice"] == "draft"
    assert row.gap == policy.FIRST_GAP


def test_one_short_round_does_not_turn_a_paying_row_plain():
    """Break-even at 2.5 tokens a round (drafting costs 2.5 plain rounds): a row appending 3 a round keeps drafting
    after one round that appends 1, and the first rounds count equally (no single round decides)."""
    row = policy.RowEstimate()
    for appended in (3, 3, 3, 3, 3, 3, 1):
        row.learn(appended, 4)
    assert policy.decide(flat(1.0, 1.5), [row], depth=1)["policy_choice"] == "draft"
    first = policy.RowEstimate()
    for appended in (1, 3, 3):
        first.learn(appended, 4)
    assert first.tokens == pytest.approx(7 / 3)


def brute_force(values, prof, least):
    rates = [(1 + sum(values[:m])) / (prof.round_draft(1) + prof.verify(m + 1)) for m in range(least, len(values) + 1)]
    return least + max(range(len(rates)), key=lambda i: (rates[i], -i))


@pytest.mark.parametrize("verify,values,want", [
    ([1.0] + [3.0] * 8, [0.5, 0.4, 0.3], 0),            # any node doubles the verify: the root alone
    ([1.0, 1.05, 1.1, 4.0, 4.0, 4.0], [0.9, 0.8, 0.7, 0.6, 0.5], 2),  # a small tree pays most
    ([1.0] * 8, [0.9, 0.5, 0.1], 3),                    # free verification: the full budget
])
def test_the_budget_under_the_policy_may_keep_no_node(verify, values, want):
    prof = CostProfile(list(verify), [0.2] * 3, 256, {})
    m, expected, seconds = budget.best_budget(torch.tensor(values), prof, 1, least=0)
    assert m == want == brute_force(values, prof, 0)
    assert expected == pytest.approx(1 + sum(values[:m])) and seconds == pytest.approx(0.2 + verify[m])
    assert budget.best_budget(torch.tensor(values), prof, 1)[0] == max(want, brute_force(values, prof, 1))


EAGLE2 = {"name": "eagle2", "depth": 3, "top_k": 3, "total_tokens": 8}


def drafter_of(tiny, method: dict, prof: CostProfile):
    target, _, head = tiny
    return build_drafter(OmegaConf.create(method), target, GREEDY, None, head=head,
                         weights={"policy_profile": prof})


def test_policy_always_and_no_key_leave_the_drafter_as_it_was(tiny):
    for method in (EAGLE2, {**EAGLE2, "policy": "always"}):
        assert not isinstance(drafter_of(tiny, method, flat(1.0, 9.0)), policy.PolicyDrafter)


@pytest.mark.parametrize("method", [EAGLE2, {"name": "sps", "k": 3}, {"name": "pld", "k": 4}])
def test_rows_record_the_choice_and_outputs_stay_plain_decoding(tiny, method):
    target, draft, head = tiny
    reference = engine.generate(target, build_drafter(OmegaConf.create({"name": "plain"}), target, GREEDY, None),
                                PROMPT, GREEDY, 40, set()).output_ids
    for prof, allowed in ((flat(1.0, 9.0), {"probe", "plain"}), (flat(1.0, 0.0), {"probe", "draft", "plain"})):
        drafter = build_drafter(OmegaConf.create({**method, "policy": "pays"}), target, GREEDY, None, head=head,
                                sps_draft=draft, weights={"policy_profile": prof})
        out = engine.generate(target, drafter, PROMPT, GREEDY, 40, set())
        assert out.output_ids == reference
        choices = [r.record()["policy_choice"] for r in out.rounds]
        assert choices[0] == "probe" and set(choices) <= allowed
        for r in out.rounds:
            if r.drafter["policy_choice"] == "plain":
                assert r.tree_size == 1


def test_never_paying_drafting_runs_plain_rounds(tiny):
    target, _, _ = tiny
    out = engine.generate(target, drafter_of(tiny, {**EAGLE2, "policy": "pays"}, flat(1.0, 9.0)), PROMPT, GREEDY,
                          60, set())
    choices = [r.drafter["policy_choice"] for r in out.rounds]
    assert choices.count("plain") > 0.7 * len(choices)


def test_batched_rows_decide_together_and_stay_plain_decoding(tiny):
    target, _, head = tiny
    prompts = [PROMPT, [4, 4, 9, 1], [3, 8, 2, 6, 1, 1, 5], [7, 2]]

    def run(method, prof=None):
        queue, done = deque(), {}
        for i, p in enumerate(prompts):
            d = build_drafter(OmegaConf.create(method), target, GREEDY, None, head=head,
                              weights={"policy_profile": prof})
            queue.append(BatchRequest(p, d, 30, key=i))
        BatchEngine(target, GREEDY, set(), batch_size=3).run(queue, lambda r: done.__setitem__(r.request.key, r))
        return done

    plain = run({"name": "plain"})
    ruled = run({**EAGLE2, "policy": "pays"}, flat(1.0, 9.0, rows=3))
    for key, res in ruled.items():
        assert res.output.output_ids == plain[key].output.output_ids
        assert {r.drafter["policy_choice"] for r in res.output.rounds} <= {"probe", "plain"}
    assert any(r.drafter["policy_choice"] == "plain" for res in ruled.values() for r in res.output.rounds)


def test_rows_verified_together_learn_the_padded_verify_length():
    """Rows drafting trees of 2 and 6 nodes are verified in one forward of 6 a row: both learn 6, the verify length
    they paid for (each learning its own size, the group would be priced at the largest of the rows' means, below
    the mean of the rounds' largest trees wherever the largest tree moves between rows)."""
    class Inner:
        def __init__(self, size):
            self.size = size

        @classmethod
        def propose_batch(cls, inners, roots, rooms):
            return [DraftTree(torch.arange(i.size), torch.arange(-1, i.size - 1), confidence=torch.ones(i.size))
                    for i in inners]

        def observe(self, new_tokens, hidden):
            pass

    rows = [policy.PolicyDrafter(Inner(size), flat(1.0, 0.1, rows=2)) for size in (2, 6)]
    trees = policy.PolicyDrafter.propose_batch(rows, [7, 7], [100, 100])
    assert [len(t) for t in trees] == [2, 6] and trees[0].meta["policy_choice"] == "probe"
    for row in rows:
        row.observe([1, 2], None)
    assert [row.estimate.tree_size for row in rows] == [6, 6]


def test_a_drafter_reading_its_own_nodes_is_refused():
    class Reads:
        needs_hidden = False

        def observe_target(self, tree, logits):
            pass

    with pytest.raises(ValueError, match="method.policy=always"):
        policy.PolicyDrafter(Reads(), flat(1.0, 1.0))


def test_a_bad_policy_is_one_clear_line():
    from eagle2.bench.validation import validate_method_config

    with pytest.raises(Exception, match="method.policy"):
        validate_method_config(OmegaConf.create({**EAGLE2, "policy": "sometimes"}))


def test_policy_always_keeps_the_old_hash_and_pays_does_not():
    from hydra import compose, initialize_config_dir

    from eagle2.prompts.questions import PROJECT_ROOT
    from eagle2.results.store import config_hash

    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base=None):
        pays = compose("config", ["method=eagle2", "method.policy=pays"])
        always = compose("config", ["method=eagle2", "method.policy=always"])
    old = OmegaConf.create(OmegaConf.to_container(always))
    del old.method["policy"]
    assert config_hash(always) == config_hash(old) != config_hash(pays)


def recorded_roots(runner) -> list:
    """Every catch-up of the head drafter ``runner``: (head positions committed, the feature predicted at the root)."""
    seen, caught_up = [], runner.caught_up

    def recording(fed, root_feature):
        caught_up(fed, root_feature)
        seen.append((runner.committed, root_feature.clone()))
    runner.caught_up = recording
    return seen


def kept_cases(monkeypatch) -> set:
    """The cases of ``engine.kept_features`` the rounds take: all the verified columns, the first ones, an index."""
    taken, kept_features = set(), engine.kept_features

    def recording(features, row, kept):
        first = kept[-1] == len(kept) - 1
        taken.add("index" if not first else "all" if len(kept) == features.shape[1] else "first")
        return kept_features(features, row, kept)
    monkeypatch.setattr(engine, "kept_features", recording)
    return taken


@pytest.mark.parametrize("rows", [1, 3])
@torch.no_grad()
def test_the_head_catches_up_on_the_features_of_plain_rounds(tiny, rows, monkeypatch):
    """Probe bursts between runs of plain rounds, batch 1 and batched (refilled): at every catch-up the head's root
    feature is the head's run offline over the committed sequence and its teacher-forced features, so every kept
    node's features were heard, in order (a plain round's root, a drafted round's first columns, a path past rejected
    siblings), and the plain rounds' are caught up on."""
    from eagle2.heads.eagle_head import causal_mask

    target, _, head = tiny
    taken = kept_cases(monkeypatch)
    monkeypatch.setattr(policy, "SURE_ROUNDS", 10**9)  # the gaps stay short: bursts after 4, 8, 16 plain rounds
    method = {**EAGLE2, "depth": 2, "top_k": 4, "policy": "pays"}
    prompts = [PROMPT, [4, 4, 9, 1], [3, 8, 2, 6, 1, 1, 5], [7, 2]][: 1 if rows == 1 else None]
    drafters = [drafter_of(tiny, method, flat(1.0, 9.0, rows=rows)) for _ in prompts]
    seen = [recorded_roots(d.inner) for d in drafters]
    if rows == 1:
        outputs = [engine.generate(target, drafters[0], PROMPT, GREEDY, 40, set()).output_ids]
    else:
        done = {}
        queue = deque(BatchRequest(p, d, 40, key=i) for i, (p, d) in enumerate(zip(prompts, drafters)))
        BatchEngine(target, GREEDY, set(), batch_size=rows).run(queue, lambda r: done.__setitem__(r.request.key, r))
        outputs = [done[i].output.output_ids for i in range(len(prompts))]
    steps = []
    for prompt, output, roots in zip(prompts, outputs, seen):
        ids = torch.tensor([prompt + output])
        feats = target.base_model(input_ids=ids).last_hidden_state  # f[j] of every committed token
        n = ids.shape[1] - 1  # head position j reads (t[j + 1], f[j])
        want = head(ids[:, 1:], feats[:, :-1], position_ids=torch.arange(n)[None],
                    attention_mask=causal_mask(n, 0, feats.dtype))[0]
        for committed, root in roots:
            torch.testing.assert_close(root, want[committed - 1], atol=1e-4, rtol=1e-4)
        steps += [b[0] - a[0] for a, b in zip(roots, roots[1:])]
    assert max(steps) > policy.FIRST_GAP  # catch-ups after plain rounds
    assert taken == {"all", "first", "index"}


def test_the_policy_answers_for_its_inner_drafter(tiny):
    """What the engine asks every round, the wrapper answers as its inner drafter would: its batch key (rows draft
    together exactly where their inner drafters would; none where the inner drafter has none: each row drafts alone)
    and whether it reads the target's features."""
    target = tiny[0]
    eagle2 = drafter_of(tiny, {**EAGLE2, "policy": "pays"}, flat(1.0, 9.0))
    pld = build_drafter(OmegaConf.create({"name": "pld", "k": 4, "policy": "pays"}), target, GREEDY, None,
                        weights={"policy_profile": flat(1.0, 9.0)})
    assert isinstance(eagle2, policy.PolicyDrafter) and isinstance(pld, policy.PolicyDrafter)
    assert eagle2.batch_key() == eagle2.inner.batch_key() and not hasattr(pld, "batch_key")
    assert (eagle2.needs_hidden, pld.needs_hidden) == (True, False)
    assert not hasattr(eagle2, "observe_target")
