"""The compiled path's bf16 CPU kernels: oneDNN-packed linears as an opaque op (``eagle2.core.packed_op``) and the
matrix-product attention for short queries (``eagle2.core.short_attention.product_attention``).

In bf16 no path is bit-identical to another, so the check is numeric: against the same model's fp32 forward, the
lean bf16 forward (uncompiled and through inductor) is no further off than the eager bf16 forward is, for a
prompt, one decoding step and a padded tree. Control (``test_a_wrong_packed_weight_is_caught``): the lean layers
calling a neighbouring layer's packed weights fail the comparison.
"""

from __future__ import annotations

import copy

import pytest
import torch

from eagle2.core import packed_op
from eagle2.core.cache import crop, forward_target, new_cache
from eagle2.core.compiled import attach
from eagle2.core.kernels import pack_linears, packing_available
from eagle2.core.lean_layers import LeanLinear
from eagle2.core.tree import DraftTree
from tests.conftest import tiny_llama

pytestmark = pytest.mark.skipif(not packing_available(), reason="this CPU has no oneDNN bf16 path")
PREFIX = 300  # past one cache span (256): the short-query attention applies from 256 cached positions


def hidden_states(model) -> list[torch.Tensor]:
    """The final hidden states (fp32) of a prompt, one decoding step and a padded 3-node tree after it."""
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(2, 64, (1, PREFIX), generator=gen)
    cache = new_cache(model)
    out = [forward_target(model, prompt, cache)]
    out.append(forward_target(model, torch.tensor([[5]]), cache))
    crop(cache, PREFIX)
    tree = DraftTree(torch.tensor([7, 9, 11]), torch.tensor([-1, 0, 0]), confidence=torch.ones(3))
    out.append(forward_target(model, tree.tokens[None], cache, attention_mask=tree.attention_mask(PREFIX, model.dtype),
                              position_ids=tree.position_ids(PREFIX)))
    return [h.float() for h in out]


def packed_bf16(reference):
    """A bf16 copy of ``reference`` with oneDNN-packed linears, as ``kernels=auto`` makes it here."""
    model = copy.deepcopy(reference).to(torch.bfloat16)
    pack_linears(model)
    return model


@pytest.fixture(scope="module")
def models():
    reference = tiny_llama(vocab=64, layers=2, seed=3)
    return reference, packed_bf16(reference)


def lean_linears(decoder) -> list[LeanLinear]:
    return [m for m in decoder.lean.modules() if isinstance(m, LeanLinear)]


def worst_error(reference, model) -> float:
    with torch.no_grad():
        return max(float((ours - ref).abs().max() / ref.abs().max())
                   for ours, ref in zip(hidden_states(model), hidden_states(reference)))


@pytest.mark.parametrize("compile", [False, True])
def test_lean_bf16_forward_is_as_close_to_fp32_as_eager(models, compile):
    reference, eager = models
    lean = packed_bf16(reference)
    decoder = attach(lean, compile=compile)
    assert all(linear.index is not None for linear in lean_linears(decoder)) and decoder.lean.short_queries
    assert worst_error(reference, lean) <= 2 * worst_error(reference, eager) + 1e-3


def test_a_long_compiled_forward_runs_in_chunks_and_taps_see_all_of_it(models):
    """Past ``MAX_ROWS`` tokens the compiled bf16 forward runs in chunks through the tree graph (no third graph);
    a layer tap (EAGLE-3's) still gets one capture of every position, as close to fp32 as the eager one.
    Control (by hand, once): the chunks' taps handed over one by one (the last chunk overwrites): this failed."""
    from eagle2.core.features import LayerTap
    from eagle2.core.short_attention import MAX_ROWS

    reference, eager = models
    lean = packed_bf16(reference)
    decoder = attach(lean, compile=True)
    prompt = torch.randint(2, 64, (1, 2 * MAX_ROWS + 22), generator=torch.Generator().manual_seed(1))
    calls = []
    real = decoder.step_taps
    decoder.step_taps = lambda *a, **k: calls.append(a[0].shape[1]) or real(*a, **k)
    taps = {}
    for name, model in (("ours", lean), ("eager", eager), ("fp32", reference)):
        with LayerTap(model, (0, 1)) as tap:
            forward_target(model, prompt, new_cache(model))
            taps[name] = tap.read().float()
    assert calls == [MAX_ROWS, MAX_ROWS, 32]  # three chunks, the last padded to its bucket
    assert taps["ours"].shape == taps["fp32"].shape == (1, prompt.shape[1], 2 * reference.config.hidden_size)
    err = {k: float((taps[k] - taps["fp32"]).abs().max() / taps["fp32"].abs().max()) for k in ("ours", "eager")}
    assert err["ours"] <= 2 * err["eager"] + 1e-3, err


def test_a_wrong_packed_weight_is_caught(models, monkeypatch):
    reference, eager = models
    lean = packed_bf16(reference)
    layers = attach(lean, compile=False).lean.layers
    for name in ("qkv", "o", "gate_up", "down"):  # each layer calls the other's packed weights
        first, second = getattr(layers[0], name), getattr(layers[1], name)
        monkeypatch.setattr(first, "index", second.index)
        monkeypatch.setattr(second, "index", first.index)
    assert worst_error(reference, lean) > 2 * worst_error(reference, eager) + 1e-3


def test_released_weights_leave_the_table():
    model = tiny_llama(vocab=64, layers=1, seed=4).to(torch.bfloat16)
    pack_linears(model)
    decoder = attach(model, compile=False)
    indices = [linear.index for linear in lean_linears(decoder)]
    assert all(i in packed_op._TABLE for i in indices)
    del decoder, model
    import gc

    gc.collect()
    assert not any(i in packed_op._TABLE for i in indices)


def test_decoders_in_one_process_do_not_share_a_recompile_limit():
    """A sweep compiles many targets, drafts and heads in one process, all through the same lean forward's code:
    each decoder's graphs must count on their own, or past dynamo's limit the rest run eagerly, silently.
    Control: without ``isolate_recompiles`` the third decoder here is refused a graph."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=1):
        for seed in range(3):
            model = tiny_llama(vocab=64, layers=1, seed=seed)
            attach(model, compile=True)
            cache = new_cache(model)
            forward_target(model, torch.tensor([[3]]), cache)
    assert not counters["recompile_limit"] and counters["stats"]["unique_graphs"] >= 3, dict(counters)
