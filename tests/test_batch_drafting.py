"""Batched drafting (``eagle2.drafters.head_group``): in the batch engine, EAGLE, EAGLE-2 and EAGLE-3 rows draft
together, one draft-head forward and one drafting LM-head call per depth for all rows, and every row's tree is
the one it drafts alone, round after round, with ragged prompts (rows at different committed lengths), refilled
rows and rows that finish early: in fp32 the node tokens, parents, depths, ranks and tree indices exactly, the
output tokens exactly, the confidences and path values to fp32 rounding (1e-6; measured up to 6e-8).

Why not bit for bit: a GEMM over 1-3 rows reduces in another order than over 4 or more (measured here: an
``nn.Linear`` row's output is bit-identical for every M >= 4, and differs in the last bit between M = 1, M = 2-3
and M >= 4), so the root's LM-head call over R rows differs from one over one row; and SDPA over a row's keys
padded with masked columns (rows of the batch hold different committed lengths) differs in the last bit from
SDPA over its keys alone. Either would need the per-row path padded the same way, or attention forked per row.

Negative controls (by hand, once): ``TreeHeads.expand`` fed each row its neighbour's parent features
(``parent_features.roll(1, dims=0)``): ``test_batched_trees_equal_per_row_trees`` failed for every method; the
shared catch-up writing each row's new head entries into its neighbour's cache (``TreeHeads._write_back``): it
failed for every method. Rows far behind sharing the catch-up with their pending positions one too far from the
fifth pair on (``TreeHeads._layout``, past ``BACKLOG``): ``test_rows_behind_together_catch_up_in_one_forward``
failed.
"""

from __future__ import annotations

from collections import deque

import pytest
import torch

import eagle2.core.batch_engine as batch_engine
import eagle2.core.engine as engine
import eagle2.drafters.budget as budget
import eagle2.drafters.head_group as head_group
from tests.test_batch import METHODS, PROMPTS, N, drafter, single_decode
from tests.test_batch import weights as weights  # noqa: F401 (a fixture)

GREEDY = engine.SamplingParams()
HEAD_METHODS = ["eagle", "eagle2", "eagle2_auto", "eagle3"]


def traced_batch(target, method, weights, batch_size, batch_drafting, monkeypatch, refill=True):  # noqa: F811
    """(outputs in prompt order, every tree each request drafted in order, calls of propose_batch)."""
    trees = {}  # request index -> its trees, round by round
    calls = []
    real = engine.propose_rows

    def recording(seqs, verifier, clock, batched=False):
        made, marks = real(seqs, verifier, clock, batched)
        calls.append(len(engine.drafting_groups(seqs, batched)))
        for row, seq in seqs.items():
            trees.setdefault(owner[id(seq.drafter)], []).append(made[row])
        return made, marks

    monkeypatch.setattr(engine, "propose_rows", recording)
    requests = [batch_engine.BatchRequest(p, drafter(target, method, weights), N, key=i) for i, p in enumerate(PROMPTS)]
    owner = {id(r.drafter): r.key for r in requests}
    results = {}
    batch_engine.BatchEngine(target, GREEDY, set(), batch_size, refill=refill, batch_drafting=batch_drafting).run(
        deque(requests), lambda res: results.__setitem__(res.request.key, res))
    monkeypatch.setattr(engine, "propose_rows", real)
    return [results[i].output for i in range(len(PROMPTS))], trees, calls


FLOAT_RECORDS = ("confidence", "value")
ROUNDING = 1e-6  # fp32: measured differences up to 6e-8 (the module's docstring says where they come from)


def same_tree(a, b) -> bool:
    """Node tokens, parents and the integer records exactly; confidences and path values to fp32 rounding."""
    close = torch.allclose(a.confidence, b.confidence, rtol=0, atol=ROUNDING) and all(
        torch.allclose(torch.tensor(a.records[k]), torch.tensor(b.records[k]), rtol=0, atol=ROUNDING)
        for k in FLOAT_RECORDS)
    ints = {k: v for k, v in a.records.items() if k not in FLOAT_RECORDS}
    return (torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents) and close
            and ints == {k: v for k, v in b.records.items() if k not in FLOAT_RECORDS})


@pytest.mark.parametrize("name", HEAD_METHODS)
def test_batched_trees_equal_per_row_trees(tiny, weights, monkeypatch, name):  # noqa: F811
    """With an auto budget the rows drafting together share one size (tested below), so its trees equal the
    per-row ones only where every row picks the same: under a flat profile, the largest (a measured profile
    of the tiny model made the outcome depend on timing noise)."""
    target = tiny[0]
    if name == "eagle2_auto":
        plant_profile(monkeypatch, budget.CostProfile([1.0] * 12, [0.1] * 3, 16, {}, rows=3, draft_rows=3))
    for batch_size, refill in ((3, True), (4, False)):
        alone, alone_trees, alone_groups = traced_batch(target, METHODS[name], weights, batch_size, False,
                                                        monkeypatch, refill)
        together, together_trees, groups = traced_batch(target, METHODS[name], weights, batch_size, True,
                                                        monkeypatch, refill)
        assert [o.output_ids for o in together] == [o.output_ids for o in alone]
        assert [o.accept_lengths for o in together] == [o.accept_lengths for o in alone]
        for key in alone_trees:
            assert len(together_trees[key]) == len(alone_trees[key])
            for i, (a, b) in enumerate(zip(alone_trees[key], together_trees[key])):
                assert same_tree(a, b), (name, batch_size, key, i)
        assert max(groups) == 1 < max(alone_groups)  # the rows drafted together, else one after another


@pytest.mark.parametrize("name", ["eagle2", "eagle3"])
def test_batched_output_equals_batch_one(tiny, weights, name):  # noqa: F811
    refs = single_decode(tiny[0], METHODS[name], weights)
    assert [r.output_ids for r in _batched(tiny[0], METHODS[name], weights, 3)] == refs


def _batched(target, method, weights, batch_size):  # noqa: F811
    queue = deque(batch_engine.BatchRequest(p, drafter(target, method, weights), N, key=i)
                  for i, p in enumerate(PROMPTS))
    out = {}
    batch_engine.BatchEngine(target, GREEDY, set(), batch_size).run(queue, lambda r: out.__setitem__(r.request.key, r))
    return [out[i].output for i in range(len(PROMPTS))]


def test_one_head_forward_per_depth_for_every_row(tiny, weights):  # noqa: F811
    """EAGLE-2 at depth 4 over 3 rows: a round runs the head 4 times over all rows, one catch-up over their
    pending pairs (at most ``BACKLOG`` each) and 3 depths over (3, 4) nodes, not 12 times over one row each. The
    calls over one row are the fresh prompts' backlogs (fed alone) and the rounds with one live row."""
    target, head = tiny[0], weights["head"]
    shapes = []
    hook = head.register_forward_hook(lambda module, args, out: shapes.append(tuple(out.shape[:2])))
    try:
        _batched(target, METHODS["eagle2"], weights, 3)
    finally:
        hook.remove()
    depth = METHODS["eagle2"]["depth"]
    shared = [s for s in shapes if s[0] > 1]  # (rows, positions) of the calls over several rows
    assert shared and len(shared) % depth == 0  # every round over several rows: a catch-up, then depth - 1 depths
    rounds = [shared[i: i + depth] for i in range(0, len(shared), depth)]
    # the first round catches up the rows' prompts together (lengths 3, 6, 1: none far past the others')
    assert all(r[0][1] <= head_group.BACKLOG for r in rounds[1:]) and rounds[0][0][1] <= max(map(len, PROMPTS))
    assert all(s[1] == 4 for r in rounds for s in r[1:]), rounds[:3]
    assert (3, 4) in shared  # all live rows at once, top_k nodes each


def test_rows_far_behind_the_group_feed_their_backlog_alone():
    """``fed_alone``: only a backlog past ``backlog`` and past twice the group's median is fed alone first."""
    assert head_group.fed_alone([2, 3, 2], 4) == [False] * 3
    assert head_group.fed_alone([2, 3, 40], 4) == [False, False, True]  # a fresh prompt among drafting rows
    assert head_group.fed_alone([9, 12, 10, 11], 4) == [False] * 4  # plain rounds: all behind together
    assert head_group.fed_alone([30, 40, 200], 4) == [False, False, True]
    assert head_group.fed_alone([7], 4) == [False]


@torch.no_grad()
def test_rows_behind_together_catch_up_in_one_forward(tiny, weights):  # noqa: F811
    """Rows that fell behind together (five plain rounds of the round policy, 5-8 pairs pending each, past
    ``BACKLOG``) catch up in ONE head forward over every row, and each row's root distribution and root feature
    are the ones it computes alone, to 1e-5; a row joining with a long prompt is fed alone first, then shares."""
    from tests.test_batch import sharpened

    target, head = tiny[0], sharpened(weights["head"])
    width = target.config.hidden_size
    torch.manual_seed(0)
    prompts = [[2, 5, 3], [7, 7, 3, 9, 4, 11], [8, 2, 6], [3] * 30]
    method, own = METHODS["eagle2"], {**weights, "head": head}
    rows, alone = [], []

    def join(i):
        hidden = torch.randn(len(prompts[i]), width)
        for group in (rows, alone):
            group.append(drafter(target, method, own))
            group[-1].start(prompts[i], 4, hidden)

    shapes = []
    hook = head.register_forward_hook(lambda module, args, out: shapes.append(tuple(out.shape[:2])))
    try:
        for i in range(3):
            join(i)
        for round_ in range(3):
            if round_ == 2:
                join(3)
            shapes.clear()
            logp, roots = head_group.TreeHeads(rows).catch_up()
            counts = [s[0] for s in shapes]
            assert counts == ([1, len(rows)] if round_ == 2 else [len(rows)]), (round_, shapes)
            for i, solo in enumerate(alone):
                torch.testing.assert_close(logp[i], solo.catch_up(), atol=1e-5, rtol=0)
                torch.testing.assert_close(roots[i], solo.root_feature, atol=1e-5, rtol=0)
            for _ in range(5):  # plain rounds: every row commits one or two tokens, drafts nothing
                for i, (mine, solo) in enumerate(zip(rows, alone)):
                    tokens = [int(t) for t in torch.randint(2, target.config.vocab_size, (1 + (i + _) % 2,))]
                    hidden = torch.randn(len(tokens), width)
                    mine.observe(tokens, hidden)
                    solo.observe(tokens, hidden)
    finally:
        hook.remove()


def test_rows_that_cannot_batch_draft_alone(tiny, weights):  # noqa: F811
    """Drafters without ``propose_batch`` (SpS, PLD, Medusa) or with another tree shape are never grouped."""
    target = tiny[0]
    smaller = {**METHODS["eagle2"], "total_tokens": 6}  # another budget, the same depths and top_k: one group
    methods = [METHODS[m] for m in ("eagle2", "eagle2", "sps", "pld_tree", "eagle", "eagle2_auto")] + [smaller]
    seqs = {i: engine.Sequence(drafter(target, m, weights), None, [1]) for i, m in enumerate(methods)}
    groups = engine.drafting_groups(seqs, batched=True)
    assert sorted(map(sorted, groups)) == [[0, 1, 6], [2], [3], [4], [5]]  # eagle2_auto: depth 3, not 4
    assert len(engine.drafting_groups(seqs, batched=False)) == 7


def plant_profile(monkeypatch, profile) -> None:
    """Every EAGLE-2 drafter built from now on prices its rounds with ``profile``."""
    from eagle2.drafters.eagle2_dynamic import Eagle2Drafter

    real_init = Eagle2Drafter.__init__

    def planted(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        if self.profile is not None:
            self.profile = profile

    monkeypatch.setattr(Eagle2Drafter, "__init__", planted)


def test_rows_drafting_together_share_the_best_budget(tiny, weights, monkeypatch):  # noqa: F811
    """An auto budget over rows verified together (a steep ``T_B(q)``: padding a row costs what its own nodes
    would): every round's trees have the one size whose joint rate, sum over rows of (1 + its best m values) /
    (T_draft + T_B(m + 1)), is the highest, recomputed here from each tree's drafted values. Control: the same
    rows drafting alone choose different sizes in some round (what the shared budget removes)."""
    steep = budget.CostProfile([1.0 + 0.1 * q for q in range(12)], [0.2] * 3, 16, {}, rows=3, draft_rows=3)
    plant_profile(monkeypatch, steep)
    real_propose = engine.propose_rows
    rounds = []

    def recording(seqs, verifier, clock, batched=False):
        made, marks = real_propose(seqs, verifier, clock, batched)
        rounds[-1].append(list(made.values()))
        return made, marks

    monkeypatch.setattr(engine, "propose_rows", recording)
    method, cap = METHODS["eagle2_auto"], METHODS["eagle2_auto"]["max_total_tokens"]
    for together in (True, False):
        rounds.append([])
        queue = deque(batch_engine.BatchRequest(p, drafter(tiny[0], method, weights), N, key=i)
                      for i, p in enumerate(PROMPTS))
        batch_engine.BatchEngine(tiny[0], GREEDY, set(), 3, batch_drafting=together).run(queue, lambda r: None)
    shared, alone = ([ts for ts in run if len(ts) > 1] for run in rounds)
    assert shared and alone
    for ts in shared:
        values = [sorted(t.records["value"], reverse=True)[:cap] for t in ts]
        rate = [sum(1 + sum(v[:m]) for v in values) / (0.2 + steep.verify(m + 1)) for m in range(1, cap + 1)]
        assert {len(t) for t in ts} == {2 + rate.index(max(rate))}
    assert any(len({len(t) for t in ts}) > 1 for ts in alone), [[len(t) for t in ts] for ts in alone]  # alone: differ
