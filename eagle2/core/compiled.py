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
64 rows attend through the matrix products (``eagle2.core.short_attention``) instead of SDPA's slow kernel. The graph
returns every decoder layer's input, and those of layers that carry forward pre-hooks
(``eagle2.core.features.LayerTap``, EAGLE-3) are handed to the hooks, so a tap sees the same tensors as on the
eager path and the graphs do not depend on which layers are tapped (a drafter registering its taps after the
warm-up would otherwise compile three more graphs inside its first timed prefill).

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
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from eagle2.core.clock import device_clock
from eagle2.core.lean_layers import LeanStack, fixed, rms, wants_packed
from eagle2.core.short_attention import MAX_ROWS

BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # padded query lengths of a tree verification
SPAN = 256  # the attended span of the cache is the live length rounded up to a multiple of this
# warm-up: a prompt past MAX_ROWS (run in chunks where short queries attend through products), in buffers longer
# than the span it attends, so that no shape is traced equal to another that a decoding later tells apart (dynamo
# gives equal sizes one symbol)
WARM_CONTEXT = 2 * MAX_ROWS
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


class LeanLlama(LeanStack):
    """A Llama decoder's forward over a static KV buffer (``eagle2.core.lean_layers``). Returns the final-normed
    hidden states (1, Q, H) and every layer's input (the graph does not depend on which layers are tapped)."""

    def __init__(self, model):
        cfg, base = model.config, model.base_model
        super().__init__(cfg, base.rotary_emb, base.layers[: cfg.num_hidden_layers], wants_packed(model),
                         model.dtype, model.device)
        self.embed = fixed(base.embed_tokens.weight)
        self.norm = fixed(base.norm.weight)

    def forward(self, ids, positions, mask, slots, keys, values):
        # ids, positions (B, Q); mask (B, 1, Q, S) additive; slots (Q,) cache positions, the same in every row;
        # keys, values: per layer (B, KVH, C, D), C >= S; the forward attends over the first S positions
        h = F.embedding(ids, self.embed)  # (B, Q, H)
        rope = self.rotary(positions, h.dtype)
        inputs = []
        for index, layer in enumerate(self.layers):
            inputs.append(h)
            h = h + self.attention(layer, rms(h, layer.ln_attn, self.eps), rope, mask, slots, keys[index],
                                   values[index])
            h = self.mlp(layer, h)
        return rms(h, self.norm, self.eps), inputs


class StaticDecoder:
    """The target's compiled forward and its static KV buffer (batch 1; one generation at a time)."""

    def __init__(self, model, compile: bool = True):
        reason = supports(model)
        if reason:
            raise CompileUnsupportedError(reason)
        self.layers = model.base_model.layers
        self._setup(model, LeanLlama(model), model.dtype, model.device, compile,
                    graphs=compile and model.device.type == "cuda")  # CUDA graphs (reduce-overhead) on a GPU

    def _setup(self, model, lean, dtype, device, compile: bool, graphs: bool) -> None:
        """The lean forward, its empty buffers and its two compiled steps (a head's path shares this)."""
        self.model, self.lean, self.dtype, self.device = model, lean, dtype, device
        self.compiled, self.graphs = compile, graphs
        self.keys: list[torch.Tensor] = []  # per layer (1, KVH, capacity, D)
        self.values: list[torch.Tensor] = []
        self.compile_s = 0.0
        if not compile:
            self.step = self.step_many = lean
            return
        use_disk_cache()
        if graphs:  # a graph per bucket and span: more than dynamo's default of 8 recompiles
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        # each decoder's graphs count on their own: in one process (a sweep) every target, draft and head shares
        # the lean forward's code, and past dynamo's 8 recompiles per code object it would fall back to eager
        # on a CPU, no guards on the lean modules (dynamo's check took ~0.5 of a forward's ~12 ms): nothing a graph
        # reads from them changes after construction (weights, packed-weight indices, shapes; taps are outputs),
        # and each decoder's entries are its own (isolated). Tensor inputs keep their guards. (CUDA graphs take
        # ``mode``, which excludes ``options``.)
        own = dict(isolate_recompiles=True, **({"mode": "reduce-overhead"} if graphs else {"options": {
            "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}}))
        self.step = torch.compile(lean, dynamic=False, **own)  # Q = 1: its own static graph
        self.step_many = torch.compile(lean, dynamic=None, **own)  # Q > 1: marked dynamic in ``run``

    def new_cache(self) -> "StaticKV":
        return StaticKV(self)

    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def reserve(self, positions: int) -> None:
        """Buffers of at least ``positions`` positions (grown in ``SPAN`` steps, at least doubling)."""
        self.keys, self.values = self.grown(self.keys, self.values, positions)

    def grown(self, keys: list, values: list, positions: int, rows: int = 1) -> tuple[list, list]:
        """Per-layer buffers (``rows``, KVH, C, D) of at least ``positions`` positions: ``keys``/``values`` as
        they are when they hold that many, else new ones (``SPAN`` steps, at least doubling) with their entries."""
        have = keys[0].shape[2] if keys else 0
        if positions <= have:
            return keys, values
        size = -(-max(positions, 2 * have) // SPAN) * SPAN
        lean = self.lean
        shape = (rows, lean.kv_heads, size, lean.head_dim)

        def bigger(old):  # zeros: a masked position must hold finite values
            new = torch.zeros(shape, dtype=self.dtype, device=self.device)
            if old is not None:
                new[:, :, :have] = old
            if self.compiled:  # once per buffer, not per forward (60 calls a step on SmolLM2)
                torch._dynamo.mark_dynamic(new, 2)
            if self.graphs:  # written in place inside the captured graphs: their addresses must not move
                torch._dynamo.mark_static_address(new)
            return new
        layers = range(len(lean.layers))
        return ([bigger(keys[i] if have else None) for i in layers],
                [bigger(values[i] if have else None) for i in layers])

    @torch.no_grad()
    def run(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, slots: torch.Tensor, n: int,
            buffers: tuple[list, list] | None = None):
        """One forward over inputs padded after ``n`` real tokens, in ``buffers`` (keys, values: a batch's own,
        ``eagle2.core.compiled_batch``) or the decoder's; the tap hooks see the layer inputs of the real tokens.
        Returns hidden (B, n, H)."""
        hidden, taps = self.step_taps(ids, positions, mask, slots, n, buffers)
        self.hand_to_taps(taps)
        return hidden

    def hand_to_taps(self, taps: dict[int, torch.Tensor]) -> None:
        """Call each tapped layer's pre-hooks with its input (``taps``: layer index -> input)."""
        for index, tap in taps.items():
            layer = self.layers[index]
            for hook in list(layer._forward_pre_hooks.values()):
                hook(layer, (tap,), {})

    @torch.no_grad()
    def step_taps(self, ids, positions, mask, slots, n: int, buffers=None) -> tuple[torch.Tensor, dict]:
        """``run`` without the hooks: (hidden (B, n, H), the inputs of the real tokens to each layer that carries
        forward pre-hooks, ``eagle2.core.features.LayerTap``: layer index -> input)."""
        if ids.shape[1] == 1:
            step = self.step
        else:
            step = self.step_many
            if self.compiled:
                for tensor, dim in ((ids, 1), (positions, 1), (mask, 2), (slots, 0)):
                    torch._dynamo.mark_dynamic(tensor, dim)
        if self.compiled:
            torch._dynamo.mark_dynamic(mask, 3)
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()
        keys, values = buffers or (self.keys, self.values)
        hidden, inputs = step(ids, positions, mask, slots, keys, values)
        taps = {i: inputs[i][:, :n] for i, layer in enumerate(self.layers) if layer._forward_pre_hooks}
        if self.graphs:  # the next replay overwrites a graph's outputs
            hidden, taps = hidden[:, :n].clone(), {i: tap.clone() for i, tap in taps.items()}
        return hidden[:, :n], taps

    def warm_up(self, context: int = WARM_CONTEXT) -> float:
        """Compile the graphs a decoding uses outside any timed section: a prompt longer than the short-query
        rows, Q = 1 and the tree buckets; returns the seconds it took (a cached compile: seconds)."""
        start = device_clock(self.device)
        self.reserve(2 * SPAN)
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
        additive (1, 1, N, length + N) tree mask (None: causal). Where short queries attend through the
        products (half precision on a CPU), more than ``MAX_ROWS`` tokens run in chunks of ``MAX_ROWS`` through
        the same graph as a tree (a longer forward would trace a third graph: ~20 s of a first compile, ~6 s
        of a cached one), the tap hooks called once with the whole inputs."""
        dec, n = self.decoder, input_ids.shape[1]
        if not (dec.compiled and dec.lean.short_queries and n > MAX_ROWS):
            inputs, n = self.padded_inputs(input_ids, attention_mask, position_ids)
            hidden = dec.run(*inputs, n)
            self.length += n
            return hidden
        start, hidden, taps = self.length, [], []
        for s in range(0, n, MAX_ROWS):
            e = min(n, s + MAX_ROWS)
            inputs, m = self.padded_inputs(input_ids[:, s:e],
                                           None if attention_mask is None else attention_mask[..., s:e, : start + e],
                                           None if position_ids is None else position_ids[:, s:e])
            part, part_taps = dec.step_taps(*inputs, m)
            self.length += m
            hidden.append(part)
            taps.append(part_taps)
        dec.hand_to_taps({i: torch.cat([part[i] for part in taps], dim=1) for i in taps[0]})
        return torch.cat(hidden, dim=1)

    def padded_inputs(self, input_ids, attention_mask=None, position_ids=None):
        """((ids, positions, mask, slots), n): the inputs of a forward of ``input_ids`` (1, n) at ``length..``
        padded to their bucket, the buffers grown to the span it attends."""
        if input_ids.shape[0] != 1:
            raise CompileUnsupportedError("the compiled path decodes one sequence at a time (batch_size=1)")
        return padded_inputs(self.decoder, self.length, input_ids, attention_mask, position_ids,
                             self.decoder.reserve)

    def crop(self, length: int) -> None:
        self.length = max(0, min(self.length, length))

    @property
    def layers(self) -> list[SimpleNamespace]:
        """Per layer, the live entries as ``keys``/``values`` (1, KVH, length, D) views (a batch copies a
        request prefilled alone into its row: ``eagle2.core.batch_cache``)."""
        dec = self.decoder
        return [SimpleNamespace(keys=k[:, :, : self.length], values=v[:, :, : self.length])
                for k, v in zip(dec.keys, dec.values)]

    def keep(self, prefix: int, nodes: list[int]) -> None:
        """Keep the prefix and tree ``nodes`` (ascending, root first) written at ``prefix..``."""
        if nodes != list(range(len(nodes))):
            dec = self.decoder
            src = torch.tensor(nodes, device=dec.device) + prefix
            for buffer in (*dec.keys, *dec.values):
                buffer[:, :, prefix: prefix + len(nodes)] = buffer.index_select(2, src)
        self.length = prefix + len(nodes)


def padded_mask(tree_mask, prefix: int, n: int, q: int, span: int, dtype, device, rows: int = 1) -> torch.Tensor:
    """The (rows, 1, q, span) additive mask of a forward of ``n`` real tokens per row padded to ``q`` at
    ``prefix``: real tokens as ``tree_mask`` (rows, 1, n, prefix + n) (None: causal), nothing past ``prefix + n``
    for them; a padding token sees only itself."""
    low = torch.finfo(dtype).min
    mask = torch.full((rows, 1, q, span), low, dtype=dtype, device=device)
    if tree_mask is None:
        mask[:, :, :n, :prefix] = 0
        mask[:, :, :n, prefix: prefix + n].masked_fill_(torch.ones(n, n, dtype=torch.bool, device=device).tril(), 0)
    else:
        mask[:, :, :n, : prefix + n] = tree_mask.to(device, dtype)
    pad = torch.arange(n, q, device=device)
    mask[:, :, pad, prefix + pad] = 0
    return mask


def padded_inputs(decoder, prefix: int, input_ids, attention_mask, position_ids, reserve):
    """((ids, positions, mask, slots), n): a forward of ``input_ids`` (B, n) at ``prefix..`` in every row,
    padded to its bucket; ``reserve(positions)`` grows the buffers it writes to past the span it attends."""
    rows, n = input_ids.shape
    q = bucket(n)
    span = -(-(prefix + q) // SPAN) * SPAN
    reserve(span + 1)  # the buffers always outlast the span: a graph traced with them longer stays valid
    device = decoder.device
    ids = torch.zeros(rows, q, dtype=torch.long, device=device)  # fresh: a strided view would fail a guard
    ids[:, :n] = input_ids
    slots = torch.arange(prefix, prefix + q, device=device)
    positions = slots[None].repeat(rows, 1)
    if position_ids is not None:
        positions[:, :n] = position_ids.to(device)
    mask = padded_mask(attention_mask, prefix, n, q, span, decoder.dtype, device, rows)
    return (ids, positions, mask, slots), n


def attach(model, compile: bool = True) -> StaticDecoder:
    """Give ``model`` the compiled path (``model.static_decoder``); returns it."""
    decoder = StaticDecoder(model, compile)
    model.static_decoder = decoder
    return decoder
