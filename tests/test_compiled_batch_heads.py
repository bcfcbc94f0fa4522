"""Batched drafting on the compiled path (``engine.compile=true`` at ``batch_size=B``:
``eagle2.heads.static_head_batch``, the EAGLE heads' forwards over B-row static buffers) is lossless and drafts the
trees the eager batched heads draft.

In fp32 on the tiny models, with the target on its B-row static path too, batched decoding with the heads on
their B-row path (the lean static forward uncompiled: fast) gives the eager batched engine's tokens and accept
lengths, which are plain decoding's, and every round's tree of every request is the eager batched one (nodes,
parents, depths, ranks exactly; confidences and path values to fp32 rounding), for EAGLE, EAGLE-2 and EAGLE-3,
with ragged prompts, refilled rows and a draining static wave (fewer drafting rows than B: padding rows), and
with rows drafting one after another (one real row in B). Through inductor on the tiny target: EAGLE-2's tokens.

Negative controls (run every time, each must break the check): a row's committed head entries loaded into its
neighbour's row; the real queries seeing the padding queries' entries; every query seeing every column of its
row (its row's visibility mask ignored).
"""

from __future__ import annotations

import copy

import pytest
import torch

import eagle2.core.compiled as compiled
from eagle2.heads.static_head import attach_head
from eagle2.heads.static_head_batch import StaticBatchHeadKV
from tests.test_batch import METHODS, single_decode
from tests.test_batch import weights as weights  # noqa: F401 (a fixture)
from tests.test_batch_drafting import traced_batch
from tests.test_compiled_batch import with_path

pytestmark = pytest.mark.usefixtures("synthetic_cost_profile")
HEAD_METHODS = ["eagle", "eagle2", "eagle3"]
HEADS = ("head", "eagle3_head")  # the weights keys of the EAGLE-1/2 and EAGLE-3 heads
TOLERANCE = 1e-6  # confidences and path values: fp32 rounding (the lean forward fuses q/k/v and gate/up)


def on_batch_path(weights, rows: int, compile: bool = False) -> dict:  # noqa: F811
    """``weights`` with copies of the EAGLE heads on their B-row compiled path for ``rows`` rows (``compile=False``:
    the lean static forward, not compiled); the originals stay eager."""
    out = dict(weights)
    for key in HEADS:
        out[key] = copy.deepcopy(weights[key])
        attach_head(out[key], compile=compile, rows=rows)
    return out


def same_drafting(ours, reference) -> str | None:
    """None when two ``traced_batch`` results agree (outputs, accept lengths, every request's trees), else what
    differs first."""
    (our_out, our_trees, _), (ref_out, ref_trees, _) = ours, reference
    if [o.output_ids for o in our_out] != [o.output_ids for o in ref_out]:
        return "output tokens"
    if [o.accept_lengths for o in our_out] != [o.accept_lengths for o in ref_out]:
        return "accept lengths"
    for key, trees in ref_trees.items():
        if len(our_trees[key]) != len(trees):
            return f"request {key}: round count"
        for i, (a, b) in enumerate(zip(our_trees[key], trees)):
            if not (torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)):
                return f"request {key}, round {i}: nodes"
            floats = {k for k, v in a.records.items() if v and isinstance(v[0], float)}
            if {k: v for k, v in a.records.items() if k not in floats} != {
                    k: v for k, v in b.records.items() if k not in floats}:
                return f"request {key}, round {i}: records"
            pairs = [(a.confidence, b.confidence)] + [(torch.tensor(a.records[k]), torch.tensor(b.records[k]))
                                                       for k in floats]
            if not all(torch.allclose(x, y, rtol=0, atol=TOLERANCE) for x, y in pairs):
                return f"request {key}, round {i}: confidences"
    return None


@pytest.fixture
def head_forwards(monkeypatch):
    """The real-row counts of every B-row head forward."""
    calls, real = [], StaticBatchHeadKV.forward
    monkeypatch.setattr(StaticBatchHeadKV, "forward",
                        lambda self, ids, *a, **k: calls.append(ids.shape[0]) or real(self, ids, *a, **k))
    return calls


@pytest.fixture(scope="module")
def plain_refs(tiny, weights):  # noqa: F811
    return single_decode(tiny[0], {"name": "plain"}, weights)


@pytest.fixture(scope="module")
def eager_runs(tiny, weights):  # noqa: F811
    """``eager(monkeypatch, name, batch_size, refill=True, together=True)``: the eager batched engine's
    ``traced_batch`` (the tiny target and eager heads), run once per module."""
    done = {}

    def eager(monkeypatch, name, batch_size, refill=True, together=True):
        key = (name, batch_size, refill, together)
        if key not in done:
            done[key] = traced_batch(tiny[0], METHODS[name], weights, batch_size, together, monkeypatch, refill)
        return done[key]
    return eager


@pytest.mark.parametrize("name", HEAD_METHODS)
def test_batched_static_heads_draft_as_eager(tiny, weights, plain_refs, eager_runs, head_forwards,  # noqa: F811
                                             monkeypatch, name):
    static = with_path(tiny[0], compile=False)
    for batch_size, refill in ((3, True), (4, False)):
        eager = eager_runs(monkeypatch, name, batch_size, refill)
        assert [o.output_ids for o in eager[0]] == plain_refs
        head_forwards.clear()
        ours = traced_batch(static, METHODS[name], on_batch_path(weights, batch_size), batch_size, True,
                            monkeypatch, refill)
        assert same_drafting(ours, eager) is None, (name, batch_size, same_drafting(ours, eager))
        assert max(head_forwards) == batch_size and min(head_forwards) < batch_size  # all rows; fewer (padded)


def test_rows_drafting_alone_on_the_batch_path(tiny, weights, eager_runs, head_forwards, monkeypatch):  # noqa: F811
    """``batch_drafting=false``: each row drafts alone, one real row in the head's B rows."""
    eager = eager_runs(monkeypatch, "eagle2", 3, together=False)
    ours = traced_batch(tiny[0], METHODS["eagle2"], on_batch_path(weights, 3), 3, False, monkeypatch)
    assert same_drafting(ours, eager) is None, same_drafting(ours, eager)
    assert head_forwards and set(head_forwards) == {1}


def neighbours_rows(monkeypatch):
    """Broken: row b's committed head entries loaded into row b - 1 (each row reads its neighbour's)."""
    real = StaticBatchHeadKV.load
    monkeypatch.setattr(StaticBatchHeadKV, "load", lambda self, caches, lengths, width: real(
        self, caches[1:] + caches[:1], lengths[1:] + lengths[:1], width))


def padding_visible(monkeypatch):
    """Broken: the real queries see the padding queries' entries."""
    real = compiled.padded_mask

    def mask(tree_mask, prefix, n, q, span, dtype, device, rows=1):
        out = real(tree_mask, prefix, n, q, span, dtype, device, rows)
        out[:, :, :n, prefix + n: prefix + q] = 0
        return out
    monkeypatch.setattr(compiled, "padded_mask", mask)


def visibility_ignored(monkeypatch):
    """Broken: every query sees every column of its row up to itself (the round's mask ignored)."""
    real = StaticBatchHeadKV.forward
    monkeypatch.setattr(StaticBatchHeadKV, "forward", lambda self, ids, feats, mask=None, positions=None: real(
        self, ids, feats, None if mask is None else torch.zeros_like(mask), positions))


@pytest.mark.parametrize("control", [neighbours_rows, padding_visible, visibility_ignored])
def test_the_check_catches_broken_batch_heads(tiny, weights, eager_runs, monkeypatch, control):  # noqa: F811
    """The eager target (its static path would share a broken ``padded_mask``): the heads alone are broken."""
    target = tiny[0]
    eager = eager_runs(monkeypatch, "eagle2", 3)
    assert same_drafting(traced_batch(target, METHODS["eagle2"], on_batch_path(weights, 3), 3, True, monkeypatch),
                         eager) is None
    control(monkeypatch)
    assert same_drafting(traced_batch(target, METHODS["eagle2"], on_batch_path(weights, 3), 3, True, monkeypatch),
                         eager) is not None


def test_inductor_batch_heads_equal_eager_on_tiny(tiny, weights, plain_refs, eager_runs, monkeypatch):  # noqa: F811
    """The head's B-row graphs through inductor (compiled by ``warm_up``), EAGLE-2 at B = 3 with the eager target
    (its B-row graphs: ``tests/test_compiled_batch.py``): the eager batched tokens, plain decoding's."""
    ours = on_batch_path(weights, 3, compile=True)
    assert ours["head"].static_batch.static.compiled and ours["head"].static_batch.warm_up() > 0
    outputs = [o.output_ids for o in traced_batch(tiny[0], METHODS["eagle2"], ours, 3, True, monkeypatch)[0]]
    assert outputs == [o.output_ids for o in eager_runs(monkeypatch, "eagle2", 3)[0]] == plain_refs


@torch.no_grad()
def test_a_long_catch_up_after_warm_up_compiles_nothing(weights):  # noqa: F811
    """Rows that fell behind together (the round policy's plain rounds) catch up in one forward of more queries than
    the largest bucket (``eagle2.drafters.head_group.fed_alone``): ``warm_up`` compiles that graph too, so no
    decoding round compiles (measured before: a 3.4 s compile inside the first timed round at B = 4). Control, by
    hand: ``warm_up`` without its long catch-up; this test then fails (a new graph)."""
    from torch._dynamo.utils import counters

    head = copy.deepcopy(weights["head"]).to(torch.bfloat16)  # half precision: short queries have their own path
    batch = attach_head(head, compile=True, rows=2)
    assert batch.static.lean.short_queries
    batch.warm_up()
    counters.clear()
    width, vocab = head.fc.in_features // 2, batch.static.lean.embed.shape[0]
    for q, length in ((compiled.MAX_ROWS + 36, 0), (2 * compiled.MAX_ROWS + 5, 300), (3, 500)):
        batch.length = length
        batch.forward(torch.randint(vocab, (2, q)), torch.randn(2, q, width, dtype=batch.static.dtype))
    assert not counters["stats"]["unique_graphs"], dict(counters)
