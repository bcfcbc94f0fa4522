"""Feature-level heads of several rows drafting together: one head forward and one drafting LM-head call per
depth for all rows of a batch, instead of one per row.

The batch engine (``eagle2.core.engine.propose_rows``) hands the rows whose drafters have equal ``batch_key()``
to their class's ``propose_batch``; EAGLE (``eagle_static``) and EAGLE-2 / EAGLE-3 (``eagle2_dynamic``) build
their trees with a leading row axis over the objects here, and ``propose`` is ``propose_batch`` of one row, so
the per-row path and the batched one are the same code.

- ``catch_up_rows``: each row's head catches up on its own committed pairs in its own KV cache (the rows
  accepted different lengths), then ONE drafting LM-head call gives every row's root distribution.
- ``TreeHeads``: the tree's depths. One row: its own head cache and ``HeadRunner.expand``, as before. Several:
  the rows' committed head entries are copied into one (R, kv_heads, width, head_dim) cache, row b's at
  ``0..committed[b]`` and zeros after (``width``: the longest), and each depth is one head forward over every
  row's nodes: row b's nodes see its own committed entries and their own fed ancestors, at positions
  ``committed[b] + depth - 1``. The tree entries live in that cache alone and are dropped with it; the rows'
  own caches never hold them (at one row they are dropped at the next catch-up, as always).

A shared forward is timed in every row's ``spans`` (each row's draft forward time is the shared call's, as
each row's verify time is the shared verify's).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch

from eagle2.core.cache import new_cache
from eagle2.core.compiled import CompileUnsupportedError
from eagle2.core.tree import additive_mask


@contextmanager
def shared_span(runners):
    """One span, opened in every row's ``spans``."""
    with ExitStack() as stack:
        for r in runners:
            stack.enter_context(r.spans.span())
        yield


def catch_up_rows(runners) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's head catches up (its own cache); returns (log-probs of the roots' children (R, V), the
    features predicted at the roots (R, H)), the LM head run once for all rows."""
    if len(runners) == 1:  # the row alone: ``HeadRunner.catch_up``, as ever
        logp = runners[0].catch_up()
        return logp[None], runners[0].root_feature[None]
    if getattr(runners[0].head, "static_decoder", None) is not None:  # its one buffer holds one row
        raise CompileUnsupportedError("a compiled draft head drafts one row at a time: batched drafting "
                                      "needs engine.compile=false")
    feats = torch.stack([r.catch_up_feature() for r in runners])  # (R, H)
    with shared_span(runners):
        return runners[0].log_probs_unspanned(feats), feats


class TreeHeads:
    """The head state of one drafting round over R rows (see the module's docstring)."""

    def __init__(self, runners, reserve: int = 64):
        self.runners, self.lead = list(runners), runners[0]
        if len(self.runners) == 1:
            return
        lead, device = self.lead, self.lead.device
        self.committed = torch.tensor([r.committed for r in self.runners], device=device)  # (R,)
        self.width = max(r.committed for r in self.runners)
        self.cache = stacked_cache(lead.head, [r.cache for r in self.runners], [r.committed for r in self.runners],
                                   self.width, reserve)
        self._fed = 0
        self.fed_ancestors = torch.zeros(len(self.runners), 0, 0, dtype=torch.bool, device=device)  # (R, f, f)

    @property
    def fed(self) -> int:
        """Tree nodes fed per row since the catch-up (equal for every row: each depth feeds n nodes a row)."""
        return self.lead.fed if len(self.runners) == 1 else self._fed

    def expand(self, tokens: torch.Tensor, parent_fed, depth: int, parent_features: torch.Tensor):
        """Feed one depth's nodes of every row: ``tokens`` (R, n), ``parent_fed`` (R, n) fed indices of their
        parents (-1: the root) or one list shared by the rows, ``parent_features`` (R, n, H). Returns
        (log-probs of their children (R, n, V), their predicted features (R, n, H))."""
        if len(self.runners) == 1:  # the row's own head cache, as ``HeadRunner.expand``
            logp, out = self.lead.expand(tokens[0], parent_fed if isinstance(parent_fed, list) else parent_fed[0],
                                         depth, parent_features[0])
            return logp[None], out[None]
        lead, device = self.lead, self.lead.device
        rows, n = tokens.shape
        if isinstance(parent_fed, list):
            parent_fed = torch.tensor(parent_fed, dtype=torch.long, device=device).expand(rows, -1)
        first = self._fed
        if first:  # each node's row of ancestors: its parent's row (the root's: none)
            index = parent_fed.clamp(min=0)[..., None].expand(rows, n, first)
            inherited = torch.gather(self.fed_ancestors, 1, index) & (parent_fed >= 0)[..., None]
        else:
            inherited = torch.zeros(rows, n, 0, dtype=torch.bool, device=device)
        new = torch.cat([inherited, torch.eye(n, dtype=torch.bool, device=device).expand(rows, n, n)], dim=2)
        widened = torch.cat([self.fed_ancestors, torch.zeros(rows, first, n, dtype=torch.bool, device=device)], dim=2)
        self.fed_ancestors, self._fed = torch.cat([widened, new], dim=1), first + n  # (R, f + n, f + n)
        prefix = torch.arange(self.width, device=device) < self.committed[:, None]  # (R, width): its own entries
        allowed = torch.cat([prefix[:, None].expand(rows, n, self.width), new], dim=2)  # (R, n, width + f + n)
        mask = additive_mask(allowed, lead.dtype, device)[0, 0].unsqueeze(1)  # (R, 1, n, K)
        positions = (self.committed + depth - 1)[:, None].expand(rows, n)
        with shared_span(self.runners):
            out = lead.head(tokens.to(device), parent_features, position_ids=positions, attention_mask=mask,
                            cache=self.cache)  # (R, n, H)
            logp = lead.log_probs_unspanned(out.reshape(rows * n, -1))
        return logp.reshape(rows, n, -1), out


def stacked_cache(head, caches, lengths: list[int], width: int, reserve: int):
    """A head cache of R rows: row b holds the first ``lengths[b]`` entries of ``caches[b]`` (one row each),
    zeros up to ``width`` (finite: masked out, never NaN), room for ``reserve`` more positions."""
    out = new_cache(head)
    for i, layer in enumerate(out.layers):
        src = [c.layers[i] for c in caches]
        k0, v0 = src[0].keys, src[0].values  # (1, kv_heads, length, head_dim)
        keys = k0.new_zeros((len(src), k0.shape[1], width, k0.shape[3]))  # (R, kv_heads, width, head_dim)
        values = v0.new_zeros((len(src), v0.shape[1], width, v0.shape[3]))
        for b, (s, n) in enumerate(zip(src, lengths)):
            keys[b, :, :n] = s.keys[0, :, :n]
            values[b, :, :n] = s.values[0, :, :n]
        layer.lazy_initialization(keys, values)
        layer.reserve(width + reserve)
        layer.place(0, keys, values)
    return out
