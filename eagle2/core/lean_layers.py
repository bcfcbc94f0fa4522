"""The pieces of a lean Llama-style forward over a static KV buffer, shared by the compiled target
(``eagle2.core.compiled.LeanLlama``) and the compiled draft heads (``eagle2.heads.lean_heads``).

- ``LeanLinear``: a weight and bias as stored, plus (``pack``) the weight packed for oneDNN and called through
  ``eagle2.core.packed_op`` (inside a compiled graph the stock bf16 product streams at half the speed);
- ``LeanLayer``: one decoder layer's weights, q/k/v and gate/up fused into one matrix each;
- ``LeanStack``: the rotary embedding, a layer's attention (writing its keys and values in place at ``slots``)
  and its MLP, in the transformers order of operations. Queries of at most ``MAX_ROWS`` rows in half precision
  on a CPU attend through the matrix products (``eagle2.core.short_attention.product_attention``; SDPA's CPU
  kernel is slow there); else SDPA. A graph's query length is fixed, so the choice is made when it is traced.

Whether to pack follows the run's kernels: a module whose linears are ``PackedLinear`` (``model.kernels``) is
packed (``wants_packed``).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn

from eagle2.core import packed_op
from eagle2.core.kernels import PackedLinear
from eagle2.core.short_attention import MAX_ROWS, product_attention


def rms(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm."""
    x = h.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(h.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def wants_packed(module: nn.Module) -> bool:
    """Whether the run packed ``module``'s bf16 linears for oneDNN (``model.kernels``): the lean copy does too."""
    return any(isinstance(m, PackedLinear) for m in module.modules())


def fixed(tensor: torch.Tensor | None) -> nn.Parameter | None:
    return None if tensor is None else nn.Parameter(tensor.detach(), requires_grad=False)


class LeanLinear(nn.Module):
    """``F.linear`` with a fixed weight (out, in) and bias, through the packed oneDNN op when ``pack``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool = False,
                 shared: int | None = None):
        super().__init__()
        self.weight, self.bias = fixed(weight), fixed(bias)
        self.index = None
        if pack and shared is not None:  # the eager PackedLinear's packed weight (its owner releases it)
            self.index = shared
        elif pack:
            self.index = packed_op.register(self.weight)
            weakref.finalize(self, packed_op.release, [self.index])

    @classmethod
    def of(cls, linear: nn.Module, pack: bool) -> "LeanLinear":
        """``linear`` as stored, sharing its packed weight when it is a ``PackedLinear``."""
        return cls(linear.weight, linear.bias, pack, getattr(linear, "index", None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_op.linear(x, self.weight, self.bias, self.index)


def _cat_biases(*linears) -> torch.Tensor | None:
    if all(lin.bias is None for lin in linears):
        return None
    return torch.cat([lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.weight.shape[0])
                      for lin in linears])


def fused(linears, pack: bool) -> LeanLinear:
    """One ``LeanLinear`` computing the outputs of ``linears`` (same input) concatenated."""
    return LeanLinear(torch.cat([lin.weight for lin in linears]), _cat_biases(*linears), pack)


class LeanLayer(nn.Module):
    """One decoder layer's weights: ``qkv`` and ``gate_up`` fused, ``o`` and ``down`` as stored, the norms'
    weights (``ln_attn`` None: a layer without an input norm, an EAGLE head's first)."""

    def __init__(self, layer, pack: bool = False):
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = fused((attn.q_proj, attn.k_proj, attn.v_proj), pack)
        self.qkv_sizes = (attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0], attn.v_proj.weight.shape[0])
        self.o = LeanLinear.of(attn.o_proj, pack)
        self.gate_up = fused((mlp.gate_proj, mlp.up_proj), pack)
        self.down = LeanLinear.of(mlp.down_proj, pack)
        self.ln_attn = fixed(getattr(layer.input_layernorm, "weight", None))
        self.ln_mlp = fixed(layer.post_attention_layernorm.weight)


class LeanStack(nn.Module):
    """Rotary embedding, attention and MLP of ``LeanLayer``s over per-layer static KV buffers."""

    def __init__(self, config, rotary, layers, pack: bool, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.eps = config.rms_norm_eps
        self.register_buffer("inv_freq", rotary.inv_freq.detach().float().clone(), persistent=False)
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.pack = pack  # the run's linears are packed: so are this stack's (and its owner's extra linears)
        self.layers = nn.ModuleList(LeanLayer(layer, pack) for layer in layers)
        self.short_queries = torch.device(device).type == "cpu" and dtype in (torch.bfloat16, torch.float16)

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each (B, 1, Q, D), as LlamaRotaryEmbedding gives them for ``positions`` (B, Q)."""
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return ((emb.cos() * self.rope_scale).to(dtype)[:, None], (emb.sin() * self.rope_scale).to(dtype)[:, None])

    def attention(self, layer: LeanLayer, x, rope, mask, slots, keys, values) -> torch.Tensor:
        """Self-attention of ``x`` (B, Q, in) over the first ``mask.shape[-1]`` positions of the buffers
        ``keys``/``values`` (B, KVH, C, D), its own keys and values written at ``slots`` (Q,) first, the same
        slots in every row; ``mask`` (B, 1, Q, S) additive. Returns the output projection (B, Q, H)."""
        rows, q_len, d = x.shape[0], x.shape[1], self.head_dim
        q, k, v = layer.qkv(x).split(layer.qkv_sizes, dim=-1)
        q = q.view(rows, q_len, self.heads, d).transpose(1, 2)  # (B, NH, Q, D)
        k = k.view(rows, q_len, self.kv_heads, d).transpose(1, 2)
        v = v.view(rows, q_len, self.kv_heads, d).transpose(1, 2)
        cos, sin = rope
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        keys.index_copy_(2, slots, k)
        values.index_copy_(2, slots, v)
        span, scale = mask.shape[-1], d ** -0.5
        k, v = keys[:, :, :span], values[:, :, :span]
        if self.short_queries and q_len <= MAX_ROWS:
            a = product_attention(q, k, v, mask, scale)
        else:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                               enable_gqa=self.heads != self.kv_heads)
        return layer.o(a.transpose(1, 2).reshape(rows, q_len, self.heads * d))

    def mlp(self, layer: LeanLayer, h: torch.Tensor) -> torch.Tensor:
        """``h`` plus the layer's MLP on its post-attention norm."""
        gate, up = layer.gate_up(rms(h, layer.ln_mlp, self.eps)).chunk(2, dim=-1)
        return h + layer.down(F.silu(gate) * up)
