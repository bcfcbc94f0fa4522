"""Batched decoding (``eagle2.core.batch_engine``) is lossless at every batch size: in fp32, greedy outputs at
B = 2, 3, 4 with ragged prompts (more prompts than rows: freed rows are refilled, or the batch drains) are
token-identical to batch-1 plain decoding for every method, each request with its own drafter and tree.
At T > 0 every row with its own seeded generator decodes exactly what the batch-1 engine decodes.

The one-forward drafters (P-EAGLE, DFlash, PARD: the rows of a round draft together, ``eagle2.drafters.head_group``)
draft in a batch what they draft at batch 1: per row, at T = 0 and T > 0, with rows refilled mid-run (rows at
different lengths, a joining row's prompt to catch up), the same outputs, accepted lengths and drafted nodes
(confidences to float32 rounding); and their rounds are shared: ONE draft forward a round over every row (P-EAGLE's
head, DFlash's and PARD's draft models).

Negative controls, each caught: one prefix length for the whole batch (a row's queries see the stale entries
between its own length and the batch width), positions from the batch width instead of the row's own
length, and (for the one-forward drafters) features handed to another row's drafter, a refilled row's PARD
draft started without its prompt's first token, or each row's batched draft forward fed the next row's context.
"""

from __future__ import annotations

import copy
from collections import deque

import pytest
import torch
from omegaconf import OmegaConf

import eagle2.core.batch_engine as batch_engine
import eagle2.core.engine as engine
from eagle2.bench.methods import build_drafter
from eagle2.core.sampling import SamplingParams
from tests import one_forward
from tests.conftest import shared_drafter_weights
from tests.test_greedy import SPEC_METHODS, positional  # noqa: F401 (a fixture)
from tests.test_hydra import tiny_hydra
from tests.test_lossless_new_methods import GREEDY_METHODS
from tests.test_medusa import tiny_medusa

GREEDY = SamplingParams()
METHODS = {"plain": {"name": "plain"}, **SPEC_METHODS, **GREEDY_METHODS,
           "medusa": {"name": "medusa", "choices": [[0], [1], [2], [0, 0], [1, 0], [0, 0, 0]]},
           "hydra": {"name": "hydra", "choices": [[0], [1], [2], [0, 0], [1, 0], [0, 0, 0]]}}
# ragged: lengths 3, 6, 1, 9, 4, 2 (six requests: every B < 6 refills or drains)
PROMPTS = [[2, 5, 3], [7, 7, 3, 9, 4, 11], [3], [1 + 3, 8, 8, 2, 6, 5, 9, 12, 10], [13, 2, 2, 7], [9, 4]]
N = 30


@pytest.fixture(scope="module")
def weights(tiny):
    target, draft, head = tiny
    return {"head": head, "sps_draft": draft, **shared_drafter_weights(target),
            "medusa_head": tiny_medusa(target, num_heads=3), "hydra_head": tiny_hydra(target, num_heads=3)}


def drafter(target, method, weights, params=GREEDY, generator=None):
    return build_drafter(OmegaConf.create(method), target, params, generator, weights=weights)


def batch_decode(target, method, weights, batch_size, refill=True, params=GREEDY, seeds=None, n=N, eos=()):
    """Outputs (in prompt order) of the prompts decoded ``batch_size`` at a time, and the batch facts."""
    gens = [None if seeds is None else torch.Generator().manual_seed(s) for s in (seeds or PROMPTS)]
    queue = deque(batch_engine.BatchRequest(p, drafter(target, method, weights, params, g), n, g, key=i)
                  for i, (p, g) in enumerate(zip(PROMPTS, gens)))
    results = {}

    def done(res):
        assert res.error is None, res.error
        results[res.request.key] = res

    batch_engine.BatchEngine(target, params, set(eos), batch_size, refill=refill).run(queue, done)
    return [results[i] for i in range(len(PROMPTS))]


def single_decode(target, method, weights, params=GREEDY, seeds=None, n=N, eos=()):
    outs = []
    for i, prompt in enumerate(PROMPTS):
        gen = None if seeds is None else torch.Generator().manual_seed(seeds[i])
        outs.append(engine.generate(target, drafter(target, method, weights, params, gen), prompt, params, n,
                                    set(eos), gen).output_ids)
    return outs


@pytest.fixture(scope="module")
def plain_refs(tiny, weights):
    return single_decode(tiny[0], {"name": "plain"}, weights)


@pytest.mark.parametrize("name", list(METHODS))
def test_batched_greedy_equals_plain(tiny, weights, plain_refs, name):
    target = tiny[0]
    for batch_size, refill in ((2, True), (3, False), (4, True)):
        results = batch_decode(target, METHODS[name], weights, batch_size, refill)
        assert [r.output.output_ids for r in results] == plain_refs, (batch_size, refill)
        assert {r.batch_slot for r in results} == set(range(batch_size))
        if not refill:  # static: two waves of three, each with its own id and one wall time
            assert [r.batch_id for r in results] == [0, 0, 0, 1, 1, 1]
            assert len({r.batch_wall_time_s for r in results[:3]}) == 1


def test_batched_rounds_accept_different_lengths_per_row(tiny, weights):
    results = batch_decode(tiny[0], METHODS["pld_tree"], weights, 3)
    lengths = [r.output.accept_lengths for r in results]
    assert any(a != b for a, b in zip(lengths[0], lengths[1]))  # rows committed different lengths
    padded = [r for res in results for r in res.output.rounds if r.tree_size < r.drafter["batch_nodes"]]
    assert padded  # some rounds padded a row's tree with dummy nodes


def test_eos_and_max_new_tokens_per_row(tiny, weights, plain_refs):
    eos = plain_refs[1][7]
    results = batch_decode(tiny[0], METHODS["eagle2"], weights, 3, eos={eos}, n=N)
    for ref, res in zip(plain_refs, results):
        expect = ref[: ref.index(eos) + 1] if eos in ref else ref
        assert res.output.output_ids == expect
        assert sum(res.output.accept_lengths) == res.output.new_tokens - 1
    short = batch_decode(tiny[0], METHODS["eagle2"], weights, 3, n=5)
    assert [r.output.output_ids for r in short] == [ref[:5] for ref in plain_refs]


def test_sampled_rows_equal_batch_one_with_their_seeds(tiny, weights):
    params = SamplingParams(temperature=1.0)
    seeds = [11, 12, 13, 14, 15, 16]
    for name in ("plain", "sps", "eagle2", "pld", "hydra"):
        ref = single_decode(tiny[0], METHODS[name], weights, params, seeds)
        for batch_size in (2, 4):
            out = batch_decode(tiny[0], METHODS[name], weights, batch_size, params=params, seeds=seeds)
            assert [r.output.output_ids for r in out] == ref, (name, batch_size)


GOOD_INPUTS = batch_engine.verify_inputs


def one_prefix_for_the_batch(trees, lengths, width, rows):
    """Broken: every row's queries see the whole batch width as their prefix (shorter rows' stale entries too)."""
    tokens, positions, _ = GOOD_INPUTS(trees, lengths, width, rows)
    return tokens, positions, GOOD_INPUTS(trees, [width] * rows, width, rows)[2]


def positions_from_the_width(trees, lengths, width, rows):
    """Broken: position ids start at the batch width for every row."""
    tokens, _, allowed = GOOD_INPUTS(trees, lengths, width, rows)
    return tokens, GOOD_INPUTS(trees, [width] * rows, width, rows)[1], allowed


@pytest.mark.parametrize("control", [one_prefix_for_the_batch, positions_from_the_width])
def test_identity_check_catches_broken_batching(positional, monkeypatch, control):  # noqa: F811
    target = positional  # sharp attention: outputs depend on positions (tests/test_greedy.py)
    refs = single_decode(target, {"name": "plain"}, {})
    assert [r.output.output_ids for r in batch_decode(target, {"name": "plain"}, {}, 3)] == refs
    monkeypatch.setattr(batch_engine, "verify_inputs", control)
    assert [r.output.output_ids for r in batch_decode(target, {"name": "plain"}, {}, 3)] != refs


@pytest.mark.heavy  # the runner's multi-turn batching on SmolLM2, twice; batched = batch 1 on tiny targets above
def test_runner_batches_multiturn_rows_identical_to_batch_one(tmp_path, smollm2):
    """run.py's path: MT-bench turns (later turns queued behind their first) at batch_size=2 store the same
    outputs as batch 1, with the batch fields; the batch keys enter the config hash only when B > 1."""
    from eagle2.bench.runner import run
    from eagle2.results.store import config_hash
    from tests.test_runner import config, rows

    common = ["method=plain", "dataset=mt_bench", "dataset.limit=3", "max_new_tokens=8", "model.dtype=float32",
              f"paths.results={tmp_path}"]
    one = config(*common)
    assert config_hash(one) == config_hash(config(*common, "batch_size=1", "batch_refill=false"))
    assert config_hash(one) != config_hash(config(*common, "batch_size=2"))
    run(one)
    run(config(*common, "batch_size=2"))
    by_size = {}
    for r in rows(tmp_path):
        by_size.setdefault(r["batch_size"], {})[(r["question_id"], r["turn"])] = r
    assert len(by_size[2]) == 6 and by_size[2].keys() == by_size[1].keys()
    for key, r in by_size[2].items():
        assert r["output_ids"] == by_size[1][key]["output_ids"]
        assert r["batch_slot"] in (0, 1) and r["batch_wall_time_s"] > 0
        assert 0 <= r["batch_admitted_at"] < r["batch_retired_at"] and r["batch_run_start"] > 0
    assert all(r["batch_id"] is None and r["batch_admitted_at"] is None for r in by_size[1].values())


def test_one_lm_head_call_per_round_covers_every_row(tiny, weights, plain_refs, monkeypatch):
    """The target's LM head runs once per round for all live rows (plus once per admitted prompt), not B times."""
    target, calls, rounds = tiny[0], [], []
    handle = target.lm_head.register_forward_hook(lambda mod, args, out: calls.append(args[0].shape[0]))
    real_round = batch_engine.BatchEngine._round
    monkeypatch.setattr(batch_engine.BatchEngine, "_round",
                        lambda self, live, cache: rounds.append(len(live)) or real_round(self, live, cache))
    try:
        results = batch_decode(target, {"name": "plain"}, weights, 3)
    finally:
        handle.remove()
    assert [r.output.output_ids for r in results] == plain_refs
    assert len(calls) == len(PROMPTS) + len(rounds)
    assert max(rounds) == 3 and calls.count(3) >= 1  # a full round: one call over its three rows' nodes


def test_batch_one_and_batched_share_one_round(tiny, weights, plain_refs, monkeypatch):
    """One round function: a broken acceptance rule patched into the batch-1 engine's round (where the
    certification tests patch it) changes batched outputs too, and the batch engine imports no private name
    of the batch-1 engine. (Two round loops, each importing its own rule, would pass a rule broken in only one.)"""
    import ast
    from pathlib import Path

    from tests.broken_rules import accept_second_choice_too

    source = ast.parse(Path(batch_engine.__file__).read_text())
    private = [a.name for n in ast.walk(source) if isinstance(n, ast.ImportFrom) and n.module == "eagle2.core.engine"
               for a in n.names if a.name.startswith("_")]
    assert private == []
    method = METHODS["eagle2"]
    assert [r.output.output_ids for r in batch_decode(tiny[0], method, weights, 3)] == plain_refs
    monkeypatch.setattr(engine, "accept_greedy", accept_second_choice_too)
    broken = [r.output.output_ids for r in batch_decode(tiny[0], method, weights, 3)]
    assert broken != plain_refs
    assert broken == single_decode(tiny[0], method, weights)  # the same broken round at batch 1


ONE_FORWARD = ("peagle", "dflash", "pard")


def drafted(results) -> list[tuple]:
    """Per request: (outputs, accepted lengths, each drafted node's (round, tree index, depth, rank, accepted))."""
    return [(o.output_ids, o.accept_lengths,
             list(zip(*(o.nodes[k] for k in ("round", "tree_index", "depth", "rank", "accepted")))))
            for o in results]


def one_forward_batch_and_one(target, name, weights, temperature):
    """The six prompts' outputs at batch 1 and at B = 3 (rows refilled), each request with its seeded generator."""
    params, seeds = SamplingParams(temperature=temperature), [11, 12, 13, 14, 15, 16]
    one = [engine.generate(target, drafter(target, METHODS[name], weights, params, g), p, params, N, set(), g)
           for p, g in zip(PROMPTS, (torch.Generator().manual_seed(s) for s in seeds))]
    return one, [r.output for r in batch_decode(target, METHODS[name], weights, 3, params=params, seeds=seeds)]


@pytest.mark.parametrize("temperature", [pytest.param(0.0, marks=pytest.mark.heavy), 1.0])  # T=0: in CI after make test
@pytest.mark.parametrize("name", ONE_FORWARD)
def test_one_forward_rows_draft_in_a_batch_what_they_draft_alone(tiny, weights, name, temperature):
    one, batched = one_forward_batch_and_one(tiny[0], name, weights, temperature)
    assert drafted(batched) == drafted(one)
    for mine, ref in zip(batched, one):
        torch.testing.assert_close(mine.nodes["confidence"], ref.nodes["confidence"], rtol=1e-4, atol=1e-6)
    assert any(a > 1 for o in one for a in o.accept_lengths)  # drafts were accepted: the nodes mattered


def features_of_the_next_row(verify):
    """Broken: each row's drafter receives the next row's target features."""
    def broken(self, trees):
        logits, features, facts = verify(self, trees)
        return logits, features.roll(1, dims=0), facts
    return broken


def pard_admitted_without_the_first_prompt_token(prefill):
    """Broken: a batched row's PARD draft starts from its prompt less the first token."""
    def broken(target, cache, prompt_ids, drafter, *args):
        first = prefill(target, cache, prompt_ids, drafter, *args)
        drafter.start(list(prompt_ids)[1:], first, None)
        return first
    return broken


def context_of_the_next_row(pending_inputs):
    """Broken: a batched draft forward feeds each row the next row's pending tokens and features."""
    def broken(self):
        return tuple(None if x is None else x.roll(1, dims=0) for x in pending_inputs(self))
    return broken


@pytest.mark.heavy  # the negative controls of the check above: in CI after make test
@pytest.mark.parametrize("control", ["features", "context"])
@pytest.mark.parametrize("name", ONE_FORWARD)
def test_the_one_forward_check_catches_broken_batched_drafting(tiny, weights, monkeypatch, name, control):
    from eagle2.drafters.head_group import TreeHeads

    if control == "context":
        monkeypatch.setattr(TreeHeads, "pending_inputs", context_of_the_next_row(TreeHeads.pending_inputs))
    elif name == "pard":  # it reads no features: its batched path's own input is the row's tokens
        monkeypatch.setattr(batch_engine, "prefill", pard_admitted_without_the_first_prompt_token(batch_engine.prefill))
    else:
        monkeypatch.setattr(batch_engine.BatchVerifier, "verify",
                            features_of_the_next_row(batch_engine.BatchVerifier.verify))
    one, batched = one_forward_batch_and_one(tiny[0], name, weights, 0.0)
    assert [o.output_ids for o in batched] == [o.output_ids for o in one]  # lossless all the same
    assert drafted(batched) != drafted(one)  # but not what batch 1 drafts


WEIGHT_KIND = {"peagle": "peagle_head", "dflash": "dflash_head", "pard": "pard_draft"}


def sharpened(module):
    """A copy of ``module`` whose attention scores are 64 times larger (every q and k projection times 8): a position
    or visibility error then moves its outputs by far more than float rounding (the tiny drafts' near-uniform
    attention hides one below the end-to-end check's tolerance)."""
    module = copy.deepcopy(module)
    with torch.no_grad():
        for name, sub in module.named_modules():
            if name.endswith(("q_proj", "k_proj")):
                sub.weight.mul_(8.0)
    return module


@pytest.mark.parametrize("name, depth", [(name, None) for name in ONE_FORWARD] + [("peagle", 1)])
@torch.no_grad()
def test_one_forward_rows_drafted_together_give_their_own_distributions(tiny, weights, name, depth):
    """Rows at different lengths drafting together (``drafted_together``), a third joining in the second round with
    a fresh prompt to catch up, each with its own number of new tokens a round: every row's K distributions are the
    ones it drafts alone (``parallel_log_probs``), to 1e-5 in log-probability, round after round (P-EAGLE at
    ``depth`` 1 too: no mask slot, the catch-up alone)."""
    target, kind = tiny[0], WEIGHT_KIND[name]
    method = METHODS[name] if depth is None else {**METHODS[name], "depth": depth}
    own = {kind: sharpened(weights[kind])}
    layers = getattr(own[kind], "feature_layers", None)
    prompts, new = [[2, 5, 3], [7, 7, 3, 9, 4, 11], [1 + 3, 8, 8, 2, 6, 5, 9, 12, 10]], [[1], [2, 3, 5], [6, 7]]
    seqs = [p + [4] for p in prompts]

    def features(seq, first, count):  # the target features of positions first.. (None: PARD reads none)
        return None if layers is None else one_forward.taps_of(target, layers, seq)[first: first + count]

    rows, alone = [], []
    for round_ in range(3):
        if round_ < 2:  # rows 0 and 1 start together, row 2 joins with its whole prompt pending
            for i in ((0, 1) if round_ == 0 else (2,)):
                for group in (rows, alone):
                    group.append(drafter(target, method, own))
                    group[-1].start(prompts[i], 4, features(seqs[i], 0, len(prompts[i])))
        together = type(rows[0]).drafted_together(rows)
        assert together.shape[1] == rows[0].depth
        for i, solo in enumerate(alone):
            torch.testing.assert_close(together[i], solo.parallel_log_probs(), atol=1e-5, rtol=0)
        for i, (mine, solo) in enumerate(zip(rows, alone)):
            tokens = new[(i + round_) % 3]
            hidden = features(seqs[i] + tokens, len(seqs[i]) - 1, len(tokens))
            seqs[i] += tokens
            mine.observe(tokens, hidden)
            solo.observe(tokens, hidden)


DRAFT_MODULE = {"peagle": lambda w: w["peagle_head"], "dflash": lambda w: w["dflash_head"],
                "pard": lambda w: w["pard_draft"].lm.base_model}


def draft_forwards_per_round(target, name, weights, monkeypatch) -> list[tuple[int, int, list[int]]]:
    """B = 3, rows refilled: per round, (the rows drafting, the rows joining, the row count of each draft forward)."""
    module, rounds, seen = DRAFT_MODULE[name](weights), [], set()
    forwards, original = [], type(module).forward

    def counted(self, *args, **kwargs):
        if self is module:
            forwards.append(next(x for x in (*args, *kwargs.values()) if torch.is_tensor(x)).shape[0])
        return original(self, *args, **kwargs)

    real_round = batch_engine.BatchEngine._round

    def round_(self, live, cache):
        first, rows = len(forwards), {id(row.seq) for row in live.values()}
        real_round(self, live, cache)
        rounds.append((len(rows), len(rows - seen), forwards[first:]))
        seen.update(rows)

    monkeypatch.setattr(type(module), "forward", counted)
    monkeypatch.setattr(batch_engine.BatchEngine, "_round", round_)
    batch_decode(target, METHODS[name], weights, 3)
    return rounds


@pytest.mark.parametrize("name", ONE_FORWARD)
def test_one_forward_drafters_rows_draft_in_one_forward_a_round(tiny, weights, monkeypatch, name):
    """P-EAGLE's, DFlash's and PARD's batched rounds are real: every round runs ONE draft forward over all its rows
    (``TreeHeads.feed_block``: the rows' catch-up and their slots or block together), whatever their lengths; the
    only other draft forwards are the prompt backlogs of rows joining that round, each fed alone (at most one per
    joining row), and the per-row path never runs while rows draft together."""
    rounds = draft_forwards_per_round(tiny[0], name, weights, monkeypatch)
    for rows, joining, forwards in rounds:
        assert forwards.count(rows) == 1 and len(forwards) <= 1 + joining, (rows, joining, forwards)
        assert all(f == 1 for f in forwards if f != rows)
    assert any(rows == 3 and forwards == [3] for rows, _, forwards in rounds)  # shared: one forward, not three
    assert any(rows > 1 and joining and len(forwards) > 1 for rows, joining, forwards in rounds)  # a refill caught up
