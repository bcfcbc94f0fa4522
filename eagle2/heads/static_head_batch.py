"""The compiled path of a feature-level draft head under batching: B rows' head forwards through the head's compiled
forward (``eagle2.heads.static_head``) at static shapes, over B-row buffers of their own.

``attach_head(head, rows=B)`` (``engine.compile=true`` at ``batch_size=B``, ``eagle2.bench.compile_choice``) gives
the head a ``StaticBatchHeadKV`` (``head.static_batch``) instead of the one-row buffer: per head layer one
(B, kv_heads, capacity, head_dim) key and value buffer, the head's analogue of the target's ``StaticBatchKV``
(``eagle2.core.compiled_batch``). A drafting round over the rows (``eagle2.drafters.head_group.TreeHeads``)
``load``s it instead of stacking the rows' caches: row b's committed entries at ``0..committed[b]``, copied from
the row's own head cache (an eager one: a fresh prompt's backlog is fed there, alone); the round's catch-up and
each depth's tree nodes are then written at ``length..`` in every row, one compiled forward for all rows.

What is static, the target's patterns reused (``eagle2.core.compiled``: ``padded_inputs``, ``padded_mask``,
``SPAN``, ``BUCKETS``; the buffers grown by ``StaticDecoder.grown``):

- the rows: R <= B drafting rows run as B; a padding row's queries see only their own slots (its entries sit
  in its own row of the buffers, which no real row reads), so nothing compiles again when rows retire;
- the query count: padded to its bucket (a catch-up: the rows' pending pairs, a depth: ``top_k`` nodes; past the
  largest bucket, its own length), a padding query seeing only itself, no real query seeing a padding entry;
- the attended span: the live length rounded up to ``SPAN``; the buffers always outlast it.

Each row's visibility (its own committed columns, its own catch-up pairs up to each, its nodes' fed ancestors)
and its positions are the round's mask and position ids, as on the eager path. Q = 1 is its own graph and the
buckets above share one dynamic in Q and the span, per feature width (an EAGLE-3 head's fused target features at
the catch-up, its own outputs in the tree); ``warm_up`` compiles them before any timed section.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from eagle2.core.clock import device_clock
from eagle2.core.compiled import SPAN, WARM_CONTEXT, CompileUnsupportedError, padded_inputs


def padded_rows(rows: int, ids: torch.Tensor, mask: torch.Tensor | None, positions: torch.Tensor | None):
    """(ids, mask, positions) of R real rows (``ids`` (R, n), the additive ``mask`` (R, 1, n, K), ``positions``
    (R, n); None: causal, from the write point) padded to ``rows``: a padding row's query j sees only column
    K - n + j, its own slot."""
    extra = rows - ids.shape[0]
    if extra == 0:
        return ids, mask, positions
    n = ids.shape[1]
    ids = torch.cat([ids, ids.new_zeros(extra, n)])
    if positions is not None:
        positions = torch.cat([positions, positions.new_zeros(extra, n)])
    if mask is not None:
        alone = mask.new_full((extra, 1, n, mask.shape[-1]), torch.finfo(mask.dtype).min)
        j = torch.arange(n, device=mask.device)
        alone[:, :, j, mask.shape[-1] - n + j] = 0
        mask = torch.cat([mask, alone])
    return ids, mask, positions


class StaticBatchHeadKV:
    """A head's keys and values for ``rows`` drafting rows on the compiled path (see the module's docstring);
    ``static`` is the head's ``StaticHead`` (its compiled forward)."""

    def __init__(self, static, rows: int):
        self.static, self.rows, self.length = static, rows, 0
        self.keys: list[torch.Tensor] = []  # per layer (B, KVH, capacity, D)
        self.values: list[torch.Tensor] = []
        self.reserve(2 * SPAN)

    @property
    def compile_s(self) -> float:
        return self.static.compile_s

    def reserve(self, positions: int) -> None:
        self.keys, self.values = self.static.grown(self.keys, self.values, positions, self.rows)

    def get_seq_length(self) -> int:
        return self.length

    @property
    def layers(self) -> list[SimpleNamespace]:
        """Per layer, the live columns of every row as ``keys``/``values`` (B, KVH, length, D) views (a round's
        catch-up entries are copied from them into the rows' own caches)."""
        return [SimpleNamespace(keys=k[:, :, : self.length], values=v[:, :, : self.length])
                for k, v in zip(self.keys, self.values)]

    def load(self, caches, lengths: list[int], width: int) -> "StaticBatchHeadKV":
        """Row b holds the first ``lengths[b]`` entries of ``caches[b]`` (a head cache of one row, never written
        when its length is 0); the live length is ``width`` (the longest). Columns past a row's own length hold
        what earlier rounds left there (finite: the buffers start as zeros), which its mask hides."""
        if len(caches) > self.rows:
            raise CompileUnsupportedError(f"{len(caches)} rows draft together on a head compiled for {self.rows}")
        self.reserve(width + 1)
        for b, (cache, n) in enumerate(zip(caches, lengths)):
            for keys, values, own in zip(self.keys, self.values, cache.layers if n else ()):
                keys[b, :, :n] = own.keys[0, :, :n]
                values[b, :, :n] = own.values[0, :, :n]
        self.length = width
        return self

    def forward(self, input_ids, features, attention_mask=None, position_ids=None) -> torch.Tensor:
        """Predicted features (R, n, h) of R <= B rows' ``input_ids`` (R, n) and ``features`` (R, n, F) at
        ``position_ids`` (R, n; default ``length..``), written at slots ``length..`` of every row;
        ``attention_mask`` the additive (R, 1, n, length + n) mask (None: causal over every column)."""
        real = input_ids.shape[0]
        ids, mask, positions = padded_rows(self.rows, input_ids, attention_mask, position_ids)
        (ids, positions, mask, slots), n = padded_inputs(self.static, self.length, ids, mask, positions,
                                                         self.reserve)
        out = self.static.run(ids, features, positions, mask, slots, n, buffers=(self.keys, self.values))
        self.length += n
        return out[:real]

    def warm_up(self, context: int = WARM_CONTEXT) -> float:
        """Compile the B-row graphs (Q = 1, the buckets and a catch-up longer than them, every feature width) at a
        context of ``context`` positions; returns the seconds it took (the buffers are left empty, as found)."""
        static = self.static
        start = device_clock(static.device)
        vocab = static.lean.embed.shape[0]
        for width in static.lean.feature_widths:
            for q in (context, 1, 4):  # a catch-up past ``MAX_ROWS`` queries (rows behind together), Q = 1, a bucket
                self.length = context
                ids = torch.randint(vocab, (self.rows, q), device=static.device)
                self.forward(ids, torch.randn(self.rows, q, width, dtype=static.dtype, device=static.device))
        self.length = 0
        for buffer in (*self.keys, *self.values):
            buffer.zero_()
        static.compile_s = device_clock(static.device) - start
        return static.compile_s
