"""A KV cache for B requests decoded together, each row with its own length (``eagle2.core.cache``'s in-place
layers with a batch of rows).

Every layer is an ``InPlaceLayer`` whose buffer holds B rows. A batched forward writes its Q entries at
the common write point ``width`` (the longest live row) in every row; row b's own entries are
``0..lengths[b]``, so the entries between ``lengths[b]`` and ``width`` are stale and the verifier's mask
(``eagle2.core.batch_engine``) hides them. ``commit`` copies a row's accepted tree entries into place
behind its own prefix (a different count per row); ``load_row`` copies a request prefilled alone into its
row. ``width`` moves to the longest live row after every change, so the model code (which reads the
layer length) sees keys ``0..width + Q``. On the compiled path the layers are the B-row buffers of
``eagle2.core.compiled_batch`` (the same fields), and the forward is the compiled one.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from eagle2.core.cache import InPlaceLayer, new_cache
from eagle2.core.compiled_batch import StaticBatchKV


class BatchCache:
    """The target's per-layer KV buffers for ``rows`` requests, with one length per row."""

    def __init__(self, model, rows: int):
        if rows < 1:
            raise ValueError(f"a batch needs at least one row, not {rows}")
        # the compiled path: the rows' own buffers (eagle2.core.compiled_batch)
        self.cache: DynamicCache | StaticBatchKV = new_cache(model, in_place=True, rows=rows)
        if not isinstance(self.cache, StaticBatchKV) and not all(isinstance(layer, InPlaceLayer)
                                                                 for layer in self.cache.layers):
            raise TypeError("batched decoding needs full-attention layers only (no sliding-window cache)")
        self.rows = rows
        self.lengths = [0] * rows

    @property
    def width(self) -> int:
        """The common write point: where the next batched forward puts its entries."""
        return max(self.lengths)

    def _sync(self) -> None:
        for layer in self.cache.layers:
            layer.length = self.width

    def reserve(self, positions: int) -> None:
        for layer in self.cache.layers:
            layer.reserve(positions)

    def load_row(self, row: int, single) -> None:
        """Copy a one-request cache (``new_cache`` after its prefill) into ``row``; its length becomes the row's."""
        length, old = int(single.get_seq_length()), self.width
        for layer, src in zip(self.cache.layers, single.layers):
            if not layer.is_initialized:
                keys = src.keys
                layer.lazy_initialization(keys.new_empty((self.rows, *keys.shape[1:])),
                                          src.values.new_empty((self.rows, *src.values.shape[1:])))
            layer.reserve(length)
            if length > old:  # other rows' columns old..length were never written: zeros, never garbage (NaN
                layer._k[:, :, old:length] = 0  # in a masked entry would still poison the attention)
                layer._v[:, :, old:length] = 0
            layer._k[row, :, :length] = src.keys[0]
            layer._v[row, :, :length] = src.values[0]
        self.lengths[row] = length
        self._sync()

    def free(self, row: int) -> None:
        """The row's request has left the batch: its entries are no longer read."""
        self.lengths[row] = 0
        self._sync()

    def commit_rows(self, kept: dict[int, list[int]]) -> None:
        """After a forward at the current width: every row in ``kept`` keeps its tree nodes (ascending,
        root first) behind its own prefix; rows not in ``kept`` stay as they were."""
        start = self.width
        if kept:
            device = self.cache.layers[0]._k.device
            rows = torch.tensor([row for row, nodes in kept.items() for _ in nodes], device=device)
            src = torch.tensor([start + n for nodes in kept.values() for n in nodes], device=device)
            dst = torch.tensor([self.lengths[row] + i for row, nodes in kept.items() for i in range(len(nodes))],
                               device=device)
            for layer in self.cache.layers:  # one gather and one scatter per layer for every row
                k, v = layer._k[rows, :, src], layer._v[rows, :, src]  # (N, H, D) copies: the regions may overlap
                layer._k[rows, :, dst] = k
                layer._v[rows, :, dst] = v
        for row, nodes in kept.items():
            self.lengths[row] += len(nodes)
        self._sync()
