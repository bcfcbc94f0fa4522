"""The lean forwards of the feature-level draft heads over a static KV buffer: what ``torch.compile`` traces on
the compiled path (``eagle2.heads.static_head``).

``LeanEagleHead`` reproduces ``EagleHead.forward`` (``eagle2.heads.eagle_head``): ``fc(concat(embed(t), f))``,
then Llama decoder layers (the first without an input norm), no final norm. ``LeanEagle3Head`` reproduces
``Eagle3Head.forward`` (``eagle2.heads.eagle3_head``): ``fc`` on fused target features (skipped for the head's
own h-wide outputs), then one layer whose attention reads ``concat(norm(embed(t)), hidden_norm(g))``. Both
keep the eager order of operations (the stock RMSNorm, rotary embedding, SDPA) with q/k/v and gate/up fused
into one matrix each (``eagle2.core.compiled._LeanLayer``, weights shared with the head where fusing needs
no copy), and write each forward's keys and values in place at ``slots`` of the per-layer buffers.

Signature of both: ``forward(ids (1, Q), features (1, Q, F), positions (1, Q), mask (1, 1, Q, S) additive,
slots (Q,), keys, values (per layer (1, KVH, C, D), C >= S))`` -> predicted features (1, Q, h).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from eagle2.core.compiled import _LeanLayer, _rotate_half


def rms(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm."""
    x = h.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(h.dtype)


class LeanAttentionStack(nn.Module):
    """What both lean heads share: their rotary embedding, the fused layers and one decoder layer's
    attention and MLP over the static buffers."""

    def __init__(self, config, rotary, layers):
        super().__init__()
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.eps = config.rms_norm_eps
        self.register_buffer("inv_freq", rotary.inv_freq.detach().float().clone(), persistent=False)
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.layers = nn.ModuleList(_LeanLayer(layer) for layer in layers)

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each (1, 1, Q, D), as LlamaRotaryEmbedding gives them."""
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return ((emb.cos() * self.rope_scale).to(dtype)[:, None], (emb.sin() * self.rope_scale).to(dtype)[:, None])

    def attention(self, layer, x, rope, mask, slots, keys, values) -> torch.Tensor:
        """Self-attention of ``x`` (1, Q, in) over the buffer (its keys and values written at ``slots``),
        after the output projection."""
        q_len, d = x.shape[1], self.head_dim
        q, k, v = F.linear(x, layer.qkv, layer.qkv_bias).split(layer.qkv_sizes, dim=-1)
        q = q.view(1, q_len, self.heads, d).transpose(1, 2)
        k = k.view(1, q_len, self.kv_heads, d).transpose(1, 2)
        v = v.view(1, q_len, self.kv_heads, d).transpose(1, 2)
        cos, sin = rope
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        keys.index_copy_(2, slots, k)
        values.index_copy_(2, slots, v)
        span = mask.shape[-1]
        a = F.scaled_dot_product_attention(q, keys[:, :, :span], values[:, :, :span], attn_mask=mask,
                                           scale=d ** -0.5, enable_gqa=self.heads != self.kv_heads)
        return F.linear(a.transpose(1, 2).reshape(1, q_len, self.heads * d), layer.o, layer.o_bias)

    def mlp(self, layer, h: torch.Tensor) -> torch.Tensor:
        """``h`` plus the layer's MLP on its post-attention norm."""
        gate, up = F.linear(rms(h, layer.ln_mlp, self.eps), layer.gate_up, layer.gate_up_bias).chunk(2, dim=-1)
        return h + F.linear(F.silu(gate) * up, layer.down, layer.down_bias)


def _parameter(tensor: torch.Tensor | None) -> nn.Parameter | None:
    return None if tensor is None else nn.Parameter(tensor.detach(), requires_grad=False)


class LeanEagleHead(LeanAttentionStack):
    """``EagleHead.forward`` over the static buffers (see the module's docstring)."""

    def __init__(self, head):
        super().__init__(head.config, head.rotary_emb, head.layers)
        self.embed = _parameter(head.embed_tokens.weight)
        self.fc, self.fc_bias = _parameter(head.fc.weight), _parameter(head.fc.bias)
        self.feature_widths = (head.config.hidden_size,)  # the target's last hidden states

    def forward(self, ids, features, positions, mask, slots, keys, values):
        emb = F.embedding(ids, self.embed).to(features.dtype)
        h = F.linear(torch.cat([emb, features], dim=-1), self.fc, self.fc_bias)
        rope = self.rotary(positions, h.dtype)
        for index, layer in enumerate(self.layers):
            x = h if layer.ln_attn is None else rms(h, layer.ln_attn, self.eps)
            h = h + self.attention(layer, x, rope, mask, slots, keys[index], values[index])
            h = self.mlp(layer, h)
        return h


class LeanEagle3Head(LeanAttentionStack):
    """``Eagle3Head.forward`` over the static buffers (see the module's docstring)."""

    def __init__(self, head):
        mid = head.midlayer
        super().__init__(head.config, head.rotary_emb, [mid])
        self.embed = _parameter(head.embed_tokens.weight)
        self.fc = _parameter(head.fc.weight)
        self.hidden_norm = _parameter(mid.hidden_norm.weight)
        self.width = head.config.hidden_size
        self.feature_widths = (head.fc.weight.shape[1], self.width)  # fused target features; its own outputs

    def forward(self, ids, features, positions, mask, slots, keys, values):
        emb = F.embedding(ids, self.embed).to(features.dtype)
        hidden = F.linear(features, self.fc) if features.shape[-1] != self.width else features
        layer = self.layers[0]
        x = torch.cat([rms(emb, layer.ln_attn, self.eps), rms(hidden, self.hidden_norm, self.eps)], dim=-1)
        hidden = hidden + self.attention(layer, x, self.rotary(positions, hidden.dtype), mask, slots, keys[0],
                                         values[0])
        return self.mlp(layer, hidden)


def lean_head(head) -> LeanAttentionStack:
    """The lean forward of an EAGLE-1/2 or an EAGLE-3 head."""
    from eagle2.heads.eagle3_head import Eagle3Head

    return LeanEagle3Head(head) if isinstance(head, Eagle3Head) else LeanEagleHead(head)
