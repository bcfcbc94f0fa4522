"""The compiled decoding path of a feature-level draft head (EAGLE-1/2, EAGLE-3): its forward through
``torch.compile`` at fixed shapes, over a static KV buffer of its own.

``attach_head(head)`` gives the head a ``StaticHead`` (``head.static_decoder``, as ``eagle2.core.compiled.attach``
gives a target one); from then on ``eagle2.core.cache.new_cache(head)`` hands out a ``StaticHeadKV`` and
``forward_head`` runs the head's forwards through it. The target's patterns, reused (``eagle2.core.compiled``):
one preallocated buffer per layer written in place (``StaticDecoder.reserve``), the attended span rounded up to
``SPAN``, the query rows padded to a bucket with the padding masked (``StaticKV.padded_inputs``): a catch-up of
n accepted pairs runs as ``bucket(n)`` rows, a depth of EAGLE-2's tree (``top_k`` nodes) as ``bucket(top_k)``.
Q = 1 is its own static graph, the buckets above share one graph dynamic in Q (and in the span); an EAGLE-3
head has two of each, for its two feature widths (fused target features at the catch-up, its own outputs in
the tree). ``crop`` after a round is the length moving: the tree's entries past it are overwritten by the next
catch-up, never read before.

The head's buffer holds one row: one generation at a time. Under batching (``attach_head(head, rows=B)``) the
same compiled forward runs over B-row buffers instead (``eagle2.heads.static_head_batch``, ``head.static_batch``:
the rows drafting together, ``eagle2.drafters.head_group``), and the rows' own head caches stay eager. On a GPU
it compiles without CUDA graphs. ``warm_up`` compiles every graph before any timed section (inductor's disk
cache, ``eagle2.core.compiled.use_disk_cache``: a second process loads them) and returns its seconds.
"""

from __future__ import annotations

import torch

from eagle2.core.clock import device_clock
from eagle2.core.compiled import SPAN, WARM_CONTEXT, StaticDecoder, StaticKV
from eagle2.heads.lean_heads import lean_head
from eagle2.heads.static_head_batch import StaticBatchHeadKV


class StaticHead(StaticDecoder):
    """A head's compiled forward and its static KV buffer. Shares the target decoder's buffer handling
    (``_setup``, ``reserve``, ``capacity``); its own inputs add the features."""

    def __init__(self, head, compile: bool = True):  # not StaticDecoder's: there is no target to read
        param = next(head.parameters())
        self._setup(head, lean_head(head), param.dtype, param.device, compile, graphs=False)

    def new_cache(self) -> "StaticHeadKV":
        return StaticHeadKV(self)

    @torch.no_grad()
    def run(self, ids, features, positions, mask, slots, n: int, buffers: tuple[list, list] | None = None):
        """One forward over inputs (B, Q) padded after ``n`` real queries, in ``buffers`` (keys, values: B rows',
        ``eagle2.heads.static_head_batch``) or the head's own; ``features`` (R, n, F) of the first R <= B rows
        are padded here. Returns the predicted features (B, n, h)."""
        padded = torch.zeros(*ids.shape, features.shape[-1], dtype=self.dtype, device=self.device)
        padded[: features.shape[0], :n] = features  # fresh: a strided view would fail a guard
        many = ids.shape[1] > 1
        if self.compiled:
            if many:
                for tensor, dim in ((ids, 1), (padded, 1), (positions, 1), (mask, 2), (slots, 0)):
                    torch._dynamo.mark_dynamic(tensor, dim)
            torch._dynamo.mark_dynamic(mask, 3)
        step = self.step_many if many else self.step
        keys, values = buffers or (self.keys, self.values)
        return step(ids, padded, positions, mask, slots, keys, values)[:, :n]

    def warm_up(self, context: int = WARM_CONTEXT) -> float:
        """Compile the graphs a decoding uses (Q = 1 and the buckets, every feature width) outside any timed
        section; returns the seconds it took (a cached compile: seconds)."""
        start = device_clock(self.device)
        vocab = self.lean.embed.shape[0]
        self.reserve(2 * SPAN)
        for width in self.lean.feature_widths:
            cache = self.new_cache()
            for q in (context, 1, 4):
                ids = torch.randint(vocab, (1, q), device=self.device)
                cache.forward(ids, torch.randn(1, q, width, dtype=self.dtype, device=self.device))
        self.compile_s = device_clock(self.device) - start
        return self.compile_s


class StaticHeadKV(StaticKV):
    """One generation's view of a head's static buffer: ``forward`` takes the features too."""

    def forward(self, input_ids, features, attention_mask=None, position_ids=None) -> torch.Tensor:
        """Predicted features (1, N, h) of ``input_ids`` (1, N) and ``features`` (1, N, F) at positions
        ``position_ids`` (default ``length..``), written at cache slots ``length..``; ``attention_mask`` the
        additive (1, 1, N, length + N) mask over the slots (None: causal)."""
        (ids, positions, mask, slots), n = self.padded_inputs(input_ids, attention_mask, position_ids)
        out = self.decoder.run(ids, features, positions, mask, slots, n)
        self.length += n
        return out


def forward_head(head, tokens, features, positions, mask, cache) -> torch.Tensor:
    """The head's forward over R rows: ``tokens`` (R, Q), ``features`` (R, Q, F), ``positions`` (R, Q), the
    additive ``mask`` (R, 1, Q, past + Q); through the compiled path when ``cache`` is a head's static one (its
    one-row buffer, or its B-row buffers: ``eagle2.heads.static_head_batch``)."""
    if isinstance(cache, (StaticHeadKV, StaticBatchHeadKV)):
        return cache.forward(tokens, features, mask, positions)
    return head(tokens, features, position_ids=positions, attention_mask=mask, cache=cache)


def attach_head(head, compile: bool = True, rows: int = 1) -> StaticHead | StaticBatchHeadKV:
    """Give ``head`` the compiled path: for one row at a time its ``StaticHead`` (``head.static_decoder``), for
    ``rows`` > 1 drafting together B-row buffers over it (``head.static_batch``; the head's own caches stay eager).
    Returns what ``warm_up`` compiles."""
    static = StaticHead(head, compile)
    if rows == 1:
        head.static_decoder = static
        return static
    head.static_batch = StaticBatchHeadKV(static, rows)
    return head.static_batch
