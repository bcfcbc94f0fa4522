"""The compiled decoding path: a Llama-family target's forward at fixed shapes, through ``torch.compile``.

``attach(model)`` gives the model a ``StaticDecoder`` (``model.static_decoder``); from then on
``eagle2.core.cache.new_cache(model)`` hands out a ``StaticKV`` and ``forward_target`` / ``crop`` /
``keep_tree_path`` on it run here instead of through the transformers forward. What is static:

- the KV cache is one preallocated buffer (layers, k/v, kv_heads, capacity, head_dim), written in place
  at the forward's positions by ``index_copy_``; a forward attends over the first ``span`` positions of it,
  ``span`` the live length rounded up to ``SPAN`` (one dynamic dimension, so a longer context does not
  compile again), with everything past the live length masked out;
- the query length is padded up to a bucket (``BUCKETS``: 1, 2, 4, ..., 64): a tree of 26 nodes runs as
  32. A padding row attends to itself only and no real row sees a padding column, so its keys and values
  (written past the live length, never read) change nothing. Q = 1 is its own graph; the buckets above
  share one graph dynamic in Q, as does a prefill (its exact length).

The forward itself is the lean one (``LeanLlama``): q/k/v and gate/up fused into one matrix each, the
stock RMSNorm, rotary embedding and SDPA attention in the transformers order of operations. Where the run packs
its bf16 linears for oneDNN (``model.kernels``), the four matrices of each layer are packed too and the graph
calls them as an opaque op (``eagle2.core.packed_op``: inductor's own bf16 product streams the weights at half
the speed, and its weight freezing would defeat the disk cache); in half precision on a CPU, queries of at most
64 rows attend through the matrix products (``eagle2.core.short_attention``) instead of SDPA's slow kernel. Inputs of
decoder layers that carry forward pre-hooks (``eagle2.core.features.LayerTap``, EAGLE-3) are returned by
the graph and handed to those hooks, so a tap sees the same tensors as on the eager path.

On CUDA the graphs are captured as CUDA graphs (``mode="reduce-overhead"``, inductor's CUDA-graph trees: one
graph per query bucket and cache span, replayed with one launch): the KV buffers are marked as static addresses
(re-marked when they grow), each forward starts a new graph step, and its outputs are copied out before the
next replay overwrites them. That branch is exercised only on a GPU (the GPU check's ``cuda_graphs`` stage).

Compiled artifacts go to inductor's on-disk caches under ``~/.cache/eagle2/inductor`` (the FX graph and
AOTAutograd caches): a second process does not compile again. ``warm_up`` compiles before any timed
section and returns its seconds (rows: ``compile_s``).
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from eagle2.core import packed_op
from eagle2.core.clock import device_clock
from eagle2.core.kernels import PackedLinear
from eagle2.core.short_attention import MAX_ROWS, product_attention

BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # padded query lengths of a tree verification
SPAN = 256  # the attended span of the cache is the live length rounded up to a multiple of this
SUPPORTED = ("llama",)  # model_type values whose forward LeanLlama reproduces
CACHE_DIR = Path.home() / ".cache" / "eagle2" / "inductor"


class CompileUnsupportedError(ValueError):
    """The target cannot take the compiled path (its architecture, batch or device)."""


def supports(model) -> str | None:
    """None when ``model`` can take the compiled path, else why not (one line)."""
    cfg = model.config
    if getattr(cfg, "model_type", None) not in SUPPORTED:
        return f"the compiled path covers {', '.join(SUPPORTED)} targets, not {getattr(cfg, 'model_type', '?')}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"the compiled path needs a silu MLP, not {cfg.hidden_act}"
    if getattr(model, "hf_device_map", None) and len(set(model.hf_device_map.values())) > 1:
        return "the compiled path needs the target on one device"
    return None


def bucket(n: int) -> int:
    """The padded query length of an ``n``-token forward (a prefill longer than the buckets: ``n``)."""
    return next((b for b in BUCKETS if b >= n), n)


def use_disk_cache() -> None:
    """Inductor's compiled artifacts under ``~/.cache/eagle2/inductor`` unless the environment names another
    place (inductor writes its default there on first use: that one is replaced)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, os.path.abspath(default_cache_dir())):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(CACHE_DIR)


class LeanLlama(nn.Module):
    """A Llama decoder's forward over a static KV buffer, with fused projections (weights shared with
    ``model`` where fusing does not need a copy). Returns the final-normed hidden states (1, Q, H) and
    the inputs of ``tap_layers``."""

    def __init__(self, model):
        super().__init__()
        cfg, base = model.config, model.base_model
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        self.tap_layers: tuple[int, ...] = ()
        fixed = dict(requires_grad=False)
        self.embed = nn.Parameter(base.embed_tokens.weight.detach(), **fixed)
        self.norm = nn.Parameter(base.norm.weight.detach(), **fixed)
        rotary = base.rotary_emb
        self.register_buffer("inv_freq", rotary.inv_freq.detach().float().clone(), persistent=False)
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        pack = any(isinstance(module, PackedLinear) for module in model.modules())  # the run chose packed kernels
        self.layers = nn.ModuleList(_LeanLayer(layer, pack) for layer in base.layers[: cfg.num_hidden_layers])
        self.short_queries = model.device.type == "cpu" and model.dtype in (torch.bfloat16, torch.float16)

    def _rms(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # transformers' LlamaRMSNorm
        x = h.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * x.to(h.dtype)

    def _attention(self, q, k, v, mask):
        """SDPA, or for a short query in half precision on a CPU the matrix products (SDPA's CPU kernel is slow
        there: ``eagle2.core.short_attention``); the query length is fixed in each graph, so this is decided
        when the graph is traced."""
        scale = self.head_dim ** -0.5
        if self.short_queries and q.shape[2] <= MAX_ROWS:
            return product_attention(q, k, v, mask, scale)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                              enable_gqa=self.heads != self.kv_heads)

    def forward(self, ids, positions, mask, slots, keys, values):
        # ids, positions (1, Q); mask (1, 1, Q, S) additive; slots (Q,) cache positions;
        # keys, values: per layer (1, KVH, C, D), C >= S; the forward attends over the first S positions
        h = F.embedding(ids, self.embed)  # (1, Q, H)
        freqs = positions[..., None].float() * self.inv_freq  # (1, Q, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scale).to(h.dtype)[:, None]  # (1, 1, Q, D)
        sin = (emb.sin() * self.rope_scale).to(h.dtype)[:, None]
        q_len, span, d = ids.shape[1], mask.shape[-1], self.head_dim
        taps = []
        for index, layer in enumerate(self.layers):
            if index in self.tap_layers:
                taps.append(h)
            x = self._rms(h, layer.ln_attn)
            q, k, v = layer.linear("qkv", x).split(layer.qkv_sizes, dim=-1)
            q = q.view(1, q_len, self.heads, d).transpose(1, 2)  # (1, NH, Q, D)
            k = k.view(1, q_len, self.kv_heads, d).transpose(1, 2)
            v = v.view(1, q_len, self.kv_heads, d).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            keys[index].index_copy_(2, slots, k)
            values[index].index_copy_(2, slots, v)
            a = self._attention(q, keys[index][:, :, :span], values[index][:, :, :span], mask)
            h = h + layer.linear("o", a.transpose(1, 2).reshape(1, q_len, self.heads * d))
            x = self._rms(h, layer.ln_mlp)
            gate, up = layer.linear("gate_up", x).chunk(2, dim=-1)
            h = h + layer.linear("down", F.silu(gate) * up)
        return self._rms(h, self.norm), taps


class _LeanLayer(nn.Module):
    """One decoder layer's weights: q/k/v fused, gate/up fused, the rest as stored; with ``pack`` each of the four
    also packed for oneDNN (``eagle2.core.packed_op``: the compiled graph calls them as opaque ops)."""

    LINEARS = ("qkv", "o", "gate_up", "down")

    def __init__(self, layer, pack: bool = False):
        super().__init__()
        attn, mlp, fixed = layer.self_attn, layer.mlp, dict(requires_grad=False)
        self.qkv = nn.Parameter(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach(),
                                **fixed)
        self.qkv_sizes = (attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0], attn.v_proj.weight.shape[0])
        self.qkv_bias = _fused_bias(attn.q_proj, attn.k_proj, attn.v_proj)
        self.o, self.o_bias = nn.Parameter(attn.o_proj.weight.detach(), **fixed), _bias(attn.o_proj)
        self.gate_up = nn.Parameter(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach(), **fixed)
        self.gate_up_bias = _fused_bias(mlp.gate_proj, mlp.up_proj)
        self.down, self.down_bias = nn.Parameter(mlp.down_proj.weight.detach(), **fixed), _bias(mlp.down_proj)
        norm = getattr(layer.input_layernorm, "weight", None)  # None: no input norm (an EAGLE head's first layer)
        self.ln_attn = None if norm is None else nn.Parameter(norm.detach(), **fixed)
        self.ln_mlp = nn.Parameter(layer.post_attention_layernorm.weight.detach(), **fixed)
        self.packed = {name: packed_op.register(getattr(self, name)) for name in self.LINEARS} if pack else {}
        weakref.finalize(self, packed_op.release, list(self.packed.values()))

    def linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return packed_op.linear(x, getattr(self, name), getattr(self, f"{name}_bias"), self.packed.get(name))


def _bias(linear) -> nn.Parameter | None:
    return None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)


def _fused_bias(*linears) -> nn.Parameter | None:
    if all(lin.bias is None for lin in linears):
        return None
    parts = [lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.weight.shape[0]) for lin in linears]
    return nn.Parameter(torch.cat(parts).detach(), requires_grad=False)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class StaticDecoder:
    """The target's compiled forward and its static KV buffer (batch 1; one generation at a time)."""

    def __init__(self, model, compile: bool = True):
        reason = supports(model)
        if reason:
            raise CompileUnsupportedError(reason)
        self.model, self.lean = model, LeanLlama(model)
        self.layers = model.base_model.layers
        self.dtype, self.device = model.dtype, model.device
        self.compiled = compile
        self.graphs = compile and self.device.type == "cuda"  # CUDA graphs (reduce-overhead) on a GPU
        self.keys: list[torch.Tensor] = []  # per layer (1, KVH, capacity, D)
        self.values: list[torch.Tensor] = []
        self.compile_s = 0.0
        if compile:
            use_disk_cache()
            mode = "reduce-overhead" if self.graphs else None
            if self.graphs:  # a graph per bucket and span: more than dynamo's default of 8 recompiles
                torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            self.step = torch.compile(self.lean, dynamic=False, mode=mode)  # Q = 1: its own static graph
            self.step_many = torch.compile(self.lean, dynamic=None, mode=mode)  # Q > 1: marked dynamic below
        else:
            self.step = self.step_many = self.lean

    def new_cache(self) -> "StaticKV":
        return StaticKV(self)

    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def reserve(self, positions: int) -> None:
        """Buffers of at least ``positions`` positions (grown in ``SPAN`` steps, at least doubling)."""
        have = self.capacity()
        if positions <= have:
            return
        size = -(-max(positions, 2 * have) // SPAN) * SPAN
        lean = self.lean
        shape = (1, lean.kv_heads, size, lean.head_dim)

        def grown(old):  # zeros: a masked position must hold finite values
            new = torch.zeros(shape, dtype=self.dtype, device=self.device)
            if old is not None:
                new[:, :, :have] = old
            return new
        self.keys = [grown(self.keys[i] if have else None) for i in range(len(lean.layers))]
        self.values = [grown(self.values[i] if have else None) for i in range(len(lean.layers))]
        if self.graphs:  # written in place inside the captured graphs: their addresses must not move
            for buffer in (*self.keys, *self.values):
                torch._dynamo.mark_static_address(buffer)

    @torch.no_grad()
    def run(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, slots: torch.Tensor, n: int):
        """One forward over inputs padded after ``n`` real tokens; the tap hooks see the layer inputs of the
        real tokens. Returns hidden (1, n, H)."""
        tapped = tuple(i for i, layer in enumerate(self.layers) if layer._forward_pre_hooks)
        self.lean.tap_layers = tapped
        if ids.shape[1] == 1:
            step = self.step
        else:
            step = self.step_many
            if self.compiled:
                for tensor, dim in ((ids, 1), (positions, 1), (mask, 2), (slots, 0)):
                    torch._dynamo.mark_dynamic(tensor, dim)
        if self.compiled:
            for tensor in (*self.keys, *self.values):
                torch._dynamo.mark_dynamic(tensor, 2)
            torch._dynamo.mark_dynamic(mask, 3)
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()
        hidden, taps = step(ids, positions, mask, slots, self.keys, self.values)
        if self.graphs:  # the next replay overwrites a graph's outputs
            hidden, taps = hidden[:, :n].clone(), [tap.clone() for tap in taps]
        for index, tap in zip(tapped, taps):
            layer = self.layers[index]
            for hook in list(layer._forward_pre_hooks.values()):
                hook(layer, (tap[:, :n],), {})
        return hidden[:, :n]

    def warm_up(self, context: int = 64) -> float:
        """Compile the graphs a decoding uses (Q = 1 and the tree buckets) outside any timed section;
        returns the seconds it took (a cached compile: seconds)."""
        start = device_clock(self.device)
        cache = self.new_cache()
        vocab = self.model.config.vocab_size
        cache.forward(torch.randint(vocab, (1, context), device=self.device))
        for q in (1, 4):
            cache.forward(torch.randint(vocab, (1, q), device=self.device))
            cache.crop(context)
        self.compile_s = device_clock(self.device) - start
        return self.compile_s


class StaticKV:
    """One generation's view of the decoder's KV buffer: its live length, and the cache operations of
    ``eagle2.core.cache`` (forward, crop, keep a tree path) on it."""

    def __init__(self, decoder: StaticDecoder):
        self.decoder, self.length = decoder, 0

    def get_seq_length(self) -> int:
        return self.length

    def forward(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        """Hidden states (1, N, H) of ``input_ids`` (1, N) at positions ``length..``; ``attention_mask`` the
        additive (1, 1, N, length + N) tree mask (None: causal)."""
        inputs, n = self.padded_inputs(input_ids, attention_mask, position_ids)
        hidden = self.decoder.run(*inputs, n)
        self.length += n
        return hidden

    def padded_inputs(self, input_ids, attention_mask=None, position_ids=None):
        """((ids, positions, mask, slots), n): the inputs of a forward of ``input_ids`` (1, n) at ``length..``
        padded to their bucket, the buffers grown to the span it attends."""
        dec, prefix = self.decoder, self.length
        if input_ids.shape[0] != 1:
            raise CompileUnsupportedError("the compiled path decodes one sequence at a time (batch_size=1)")
        n = input_ids.shape[1]
        q = bucket(n)
        span = -(-(prefix + q) // SPAN) * SPAN
        dec.reserve(span)
        device = dec.device
        ids = F.pad(input_ids.to(device), (0, q - n))
        own = torch.arange(prefix, prefix + q, device=device)
        positions = own[None].clone()
        if position_ids is not None:
            positions[:, :n] = position_ids.to(device)
        mask = padded_mask(attention_mask, prefix, n, q, span, dec.dtype, device)
        return (ids, positions, mask, own), n

    def crop(self, length: int) -> None:
        self.length = max(0, min(self.length, length))

    def keep(self, prefix: int, nodes: list[int]) -> None:
        """Keep the prefix and tree ``nodes`` (ascending, root first) written at ``prefix..``."""
        if nodes != list(range(len(nodes))):
            dec = self.decoder
            src = torch.tensor(nodes, device=dec.device) + prefix
            for buffer in (*dec.keys, *dec.values):
                buffer[:, :, prefix: prefix + len(nodes)] = buffer.index_select(2, src)
        self.length = prefix + len(nodes)


def padded_mask(tree_mask, prefix: int, n: int, q: int, span: int, dtype, device) -> torch.Tensor:
    """The (1, 1, q, span) additive mask of a forward of ``n`` real tokens padded to ``q`` at ``prefix``:
    real rows as ``tree_mask`` (None: causal), nothing past ``prefix + n`` for them; a padding row sees
    only itself."""
    low = torch.finfo(dtype).min
    mask = torch.full((q, span), low, dtype=dtype, device=device)
    if tree_mask is None:
        mask[:n, :prefix] = 0
        mask[:n, prefix: prefix + n].masked_fill_(torch.ones(n, n, dtype=torch.bool, device=device).tril(), 0)
    else:
        mask[:n, : prefix + n] = tree_mask[0, 0].to(device, dtype)
    pad = torch.arange(n, q, device=device)
    mask[pad, prefix + pad] = 0
    return mask[None, None]


def attach(model, compile: bool = True) -> StaticDecoder:
    """Give ``model`` the compiled path (``model.static_decoder``); returns it."""
    decoder = StaticDecoder(model, compile)
    model.static_decoder = decoder
    return decoder
