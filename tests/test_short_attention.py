"""The short-query attention (``eagle2.core.short_attention``): as accurate as SDPA in half precision on every
mask the engine passes, SDPA itself wherever it does not apply, and installed by ``accelerate`` on a
half-precision CPU model (a tiny Llama decodes through it)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from eagle2.core import short_attention as sa
from eagle2.core.kernels import accelerate, kernels_in_use
from tests.conftest import tiny_llama


class Layer(torch.nn.Module):
    num_key_value_groups, is_causal = 3, True


LAYER = Layer().eval()


def inputs(rows: int, keys: int, dtype, mask: str | None, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, h, n, 64, generator=gen) for h, n in ((9, rows), (3, keys), (3, keys)))
    allowed = None
    if mask:
        allowed = torch.rand(2, 1, rows, keys, generator=gen) > 0.3
        allowed[..., 0] = True
    return q, k, v, allowed


def as_mask(allowed, kind: str | None, dtype):
    if kind == "additive":
        return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return allowed


@pytest.mark.parametrize("rows,keys,mask", [(1, 300, None), (300, 300, None), (8, 300, "bool"), (8, 300, "additive"),
                                            (64, 512, "bool")])
def test_as_accurate_as_sdpa_in_bf16(rows, keys, mask):
    """Against fp32 SDPA, the bf16 result is no further off than bf16 SDPA's (x2, + one bf16 step)."""
    q, k, v, allowed = inputs(rows, keys, torch.float32, mask)
    exact = sdpa_attention_forward(LAYER, q, k, v, as_mask(allowed, mask, torch.float32) if mask else None)[0]
    half = [t.bfloat16() for t in (q, k, v)]
    bf16_mask = as_mask(allowed, mask, torch.bfloat16) if mask else None
    ours = sa.short_query_attention(LAYER, *half, bf16_mask)[0].float()
    sdpa = sdpa_attention_forward(LAYER, *half, bf16_mask)[0].float()
    assert sa.applies(half[0], half[1], bf16_mask, False) == (rows <= sa.MAX_ROWS and (rows == 1 or mask is not None))
    assert (ours - exact).abs().max() <= 2 * (sdpa - exact).abs().max() + 2 ** -7


@pytest.mark.parametrize("case", ["fp32", "few keys", "many rows", "training", "a prompt"])
def test_hands_every_other_call_to_sdpa(case):
    rows, keys, dtype = {"few keys": (1, 100, torch.bfloat16), "many rows": (65, 300, torch.bfloat16),
                         "a prompt": (8, 300, torch.bfloat16)}.get(
        case, (1, 300, torch.float32 if case == "fp32" else torch.bfloat16))
    q, k, v, _ = inputs(rows, keys, dtype, None)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    layer = copy.deepcopy(LAYER).train(case == "training")
    ours, sdpa = (f(layer, q, k, v, None)[0] for f in (sa.short_query_attention, sdpa_attention_forward))
    assert torch.equal(ours, sdpa)


def test_accelerate_installs_it_on_a_half_cpu_model_and_decoding_agrees():
    """A tiny bf16 Llama takes the attention through ``accelerate``; its logits for 8 rows after a
    300-token context stay within bf16 noise of SDPA's, and fp32 models are left as they are."""
    model = tiny_llama(vocab=64, layers=2, seed=3, scale=10.0)
    model.config.max_position_embeddings = 512
    fp32 = copy.deepcopy(model)
    accelerate(fp32, "stock")
    assert "short_attn" not in kernels_in_use(fp32)
    sdpa, ours = copy.deepcopy(model).bfloat16(), copy.deepcopy(model).bfloat16()
    accelerate(ours, "stock")
    assert kernels_in_use(ours) == "stock+short_attn" and kernels_in_use(sdpa) == "stock"
    ids = torch.randint(2, 64, (1, 300), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        past = [m(ids[:, :-8], use_cache=True).past_key_values for m in (sdpa, ours)]
        logits = [m(ids[:, -8:], past_key_values=p).logits.float() for m, p in zip((sdpa, ours), past)]
        exact = model(ids).logits[:, -8:]
    assert (logits[1] - exact).abs().max() <= 2 * (logits[0] - exact).abs().max() + 0.05


def fp64_attention(q, k, v, allowed, scale: float) -> torch.Tensor:
    """The reference: every step in float64 (grouped heads repeated), from the very inputs given."""
    groups = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(groups, 1) for t in (k, v))
    scores = q.double() @ k.transpose(-1, -2) * scale
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize("mask", [None, "bool", "additive"])
def test_products_and_softmax_in_fp32_against_fp64(mask):
    """bf16 queries and keys: with fp32 values the result is within 1e-5 of float64 (a bf16 step at these values:
    ~4e-3, so a softmax or product rounded to bf16 fails); with bf16 values it is the float64 result rounded to
    bf16, element for element but for the rare near-tie (a bf16 softmax matches ~40%).

    Negative control (by hand): the softmax taken in bf16 in ``product_attention`` fails both checks."""
    q, k, v, allowed = inputs(8, 300, torch.float32, mask)
    q, k = q.bfloat16(), k.bfloat16()
    scale = q.shape[-1] ** -0.5
    given = as_mask(allowed, mask, torch.bfloat16) if mask else None
    exact = fp64_attention(q, k, v, allowed, scale)
    assert (sa.product_attention(q, k, v, given, scale).double() - exact).abs().max() < 1e-5
    ours = sa.product_attention(q, k, v.bfloat16(), given, scale)
    exact = fp64_attention(q, k, v.bfloat16(), allowed, scale)
    assert (ours == exact.bfloat16()).float().mean() > 0.995
    assert ((ours.double() - exact).abs() <= exact.abs() * 2**-7 + 1e-6).all()  # never beyond one bf16 step
