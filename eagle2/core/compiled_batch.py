"""The compiled path for batched decoding: B rows' KV in buffers of their own, verified through the compiled
target forward (``eagle2.core.compiled``).

``eagle2.core.batch_cache.BatchCache`` over a target with the compiled path holds a ``StaticBatchKV`` instead of a
transformers cache: per layer one (B, kv_heads, capacity, head_dim) key and value buffer, written in place by the
lean forward, with the batch's common write point (``width``, the longest row) as every layer's ``length``, as
``BatchCache`` keeps it. A batched forward of Q tokens per row is padded to its bucket, attends over the live
span rounded up to ``SPAN`` and writes its entries at ``width..`` in every row; each row's own prefix, tree
ancestors and positions come in the batch verifier's mask and position ids, as on the eager path. Requests are
prefilled alone through the decoder's own one-row buffers (``StaticKV``) and copied into their rows.

The EAGLE heads under batching follow the same patterns over B-row buffers of their own
(``eagle2.heads.static_head_batch``); a draft model's compiled path keeps one row's buffer, which rows drafting
one after another would share, so it stays eager (``eagle2.bench.compile_choice``).
"""

from __future__ import annotations

import torch

from eagle2.core.clock import device_clock
from eagle2.core.compiled import SPAN, WARM_CONTEXT, padded_inputs


class BufferLayer:
    """One layer's view of a ``StaticBatchKV``: ``_k``/``_v`` (B, KVH, capacity, D) and the common ``length``,
    what ``BatchCache`` reads and writes."""

    is_initialized = True

    def __init__(self, owner: "StaticBatchKV", index: int):
        self.owner, self.index, self.length = owner, index, 0

    @property
    def _k(self) -> torch.Tensor:
        return self.owner.keys[self.index]

    @property
    def _v(self) -> torch.Tensor:
        return self.owner.values[self.index]

    def reserve(self, positions: int) -> None:
        self.owner.reserve(positions)


class StaticBatchKV:
    """``rows`` requests' keys and values for the compiled forward (see the module's docstring)."""

    def __init__(self, decoder, rows: int):
        self.decoder, self.rows = decoder, rows
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.reserve(2 * SPAN)
        self.layers = [BufferLayer(self, i) for i in range(len(self.keys))]

    def reserve(self, positions: int) -> None:
        self.keys, self.values = self.decoder.grown(self.keys, self.values, positions, self.rows)

    def get_seq_length(self) -> int:
        return self.layers[0].length

    def crop(self, length: int) -> None:
        for layer in self.layers:
            layer.length = max(0, min(layer.length, length))

    def forward(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        """Hidden states (B, n, H) of ``input_ids`` (B, n) at ``position_ids`` (B, n; default ``width..``),
        written at slots ``width..`` of every row; ``attention_mask`` the additive (B, 1, n, width + n) mask
        (None: every row causal over all ``width`` entries, as a cost profile's equal rows)."""
        width = self.get_seq_length()
        inputs, n = padded_inputs(self.decoder, width, input_ids, attention_mask, position_ids, self.reserve)
        hidden = self.decoder.run(*inputs, n, buffers=(self.keys, self.values))
        for layer in self.layers:
            layer.length = width + n
        return hidden

    def warm_up(self, context: int = WARM_CONTEXT) -> float:
        """Compile the B-row graphs (Q = 1 and the tree buckets) at a context of ``context`` zeros; returns the
        seconds it took (the buffers are left as they were found: empty)."""
        dec = self.decoder
        start = device_clock(dec.device)
        vocab = dec.model.config.vocab_size
        for q in (1, 4):
            for layer in self.layers:
                layer.length = context
            self.forward(torch.randint(vocab, (self.rows, q), device=dec.device))  # causal, at context..
        for layer in self.layers:
            layer.length = 0
        for buffer in (*self.keys, *self.values):
            buffer.zero_()
        return device_clock(dec.device) - start
