"""Attention for short queries in half precision on a CPU: the plain matrix products, not SDPA's kernel.

On a CPU, ``torch.nn.functional.scaled_dot_product_attention`` in bf16 runs its flash kernel, which is slow for a
few query rows against a long cache: measured on SmolLM2's shapes (9 heads over 3 KV heads, head dim 64, one
thread, bf16-native AMD EPYC), one query row against 1,000 cached positions took 709 us per layer through SDPA
and 63 us as two matrix products and a softmax; 8 rows 824 vs 142 us, 32 rows 1,105 vs 885 us. A decode step of
plain decoding (one row) or a tree verification (a few dozen) is exactly that case; a prefill (many rows) is not,
and keeps SDPA (the scores of a long prompt would not fit).

``short_query_attention`` has transformers' attention-function signature; ``use_short_attention(model)``
registers it (with SDPA's mask function) as the model's attention implementation ``eagle2_short``. It computes
the products and the softmax in fp32 (as SDPA accumulates internally), and delegates to SDPA whenever
it does not apply: off a CPU, in fp32 (SDPA is as fast there), in training, above ``MAX_ROWS`` query rows, below
``MIN_KEYS`` cached positions (SmolLM2's plain decoding at 150 positions ran 0.96x with the products), or with a
per-head mask, or for several rows without a mask (a prompt: SDPA's causal flag).
"""

from __future__ import annotations

import torch
from torch import nn

NAME = "eagle2_short"
MAX_ROWS = 64  # query rows up to which the matrix products are used (a tree verification's bucket at most)
MIN_KEYS = 256  # cached positions from which they are: below it SDPA's one call costs less than the products' ops


def applies(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, training: bool) -> bool:
    """Whether this call takes the matrix-product path (else SDPA)."""
    return (query.device.type == "cpu" and query.dtype in (torch.bfloat16, torch.float16) and not training
            and query.shape[2] <= MAX_ROWS and key.shape[2] >= MIN_KEYS
            and (mask.shape[1] == 1 if mask is not None else query.shape[2] == 1))


def short_query_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                          is_causal: bool | None = None, **kwargs):
    """Attention of ``query`` (B, H, Q, D) over ``key``/``value`` (B, KVH, K, D); returns ((B, Q, H, D), None).
    ``attention_mask``: (B or 1, 1, Q, >= K), boolean (True: attend) or additive; None (one query row): every
    position. Several rows without a mask (a causal prompt) go to SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not applies(query, key, attention_mask, module.training):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return product_attention(query, key, value, attention_mask, scale).transpose(1, 2).contiguous(), None


def product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                      scale: float) -> torch.Tensor:
    """Attention as two matrix products and an fp32 softmax: ``query`` (B, H, Q, D) over ``key``/``value``
    (B, KVH, K, D), the H heads in KVH groups; ``mask`` (B or 1, 1, Q, >= K) boolean (True: attend) or additive,
    or None (every position). Returns (B, H, Q, D). Also the compiled path's attention for short queries."""
    batch, heads, rows, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    # fp32 products, as SDPA accumulates: a bf16 product rounds the scores to 8 mantissa bits before the softmax
    # (random 64-wide rows: 0.06 off against 4e-6 in fp32)
    scores = query.reshape(batch, kv_heads, groups * rows, dim).float() @ key.float().transpose(-1, -2)
    scores = scores.view(batch, kv_heads, groups, rows, length) * scale
    if mask is not None:
        mask = mask[:, :, :, :length].unsqueeze(2)  # (B, 1, 1, Q, K): every head of every group
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    weights = torch.softmax(scores, dim=-1).view(batch, kv_heads, groups * rows, length)
    return (weights @ value.float()).to(value.dtype).view(batch, heads, rows, dim)


def use_short_attention(model: nn.Module) -> None:
    """Make ``short_query_attention`` ``model``'s attention implementation (registered once per process)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, short_query_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)


def in_use(model: nn.Module) -> bool:
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME
