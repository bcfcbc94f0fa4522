"""Feature-level heads (and the one-forward draft models) of several rows drafting together: one head forward for
every row's catch-up, then one head forward and one drafting LM-head call per depth for all rows, instead of one of
each per row.

The batch engine (``eagle2.core.engine.propose_rows``) hands the rows whose drafters have equal ``batch_key()`` to
their class's ``propose_batch``; EAGLE (``eagle_static``) and EAGLE-2 / EAGLE-3 (``eagle2_dynamic``) build their
trees with a leading row axis over ``TreeHeads`` (the one-forward drafters, P-EAGLE, ``peagle``, DFlash, ``dflash``,
and PARD, ``pard``: one ``feed_block`` each), and for EAGLE / EAGLE-2 ``propose`` is ``propose_batch`` of
one row, so the per-row path and the batched one are the same code.

``TreeHeads`` over one row is the row's own head cache and ``HeadRunner``'s catch-up and ``expand``, as ever.
Over several (or over any on a head compiled for the batch):
- The rows' committed head entries are copied into one (R, kv_heads, width, head_dim) cache, row b's at
  ``0..committed[b]`` and zeros after (``width``: the longest); ``visible`` (R, columns) marks the columns
  each row's queries may see. On the compiled path (``engine.compile=true`` at ``batch_size=B``) that cache is
  the head's B-row static buffers (``eagle2.heads.static_head_batch``: the same entries at the same columns,
  the rows and queries padded to static shapes, the padding masked) and every forward below is the head's
  compiled one; the rows' own caches stay eager, so a backlog fed alone (``fed_alone``) is fed eagerly.
- ``catch_up``: ONE head forward over every row's pending (token, feature) pairs, padded to the longest
  (the last round's accepted tokens plus one, or the plain rounds' tokens where the round policy stepped aside;
  a row whose backlog is far past the group's, a fresh prompt, feeds all but its last pair alone first,
  ``fed_alone``), written at columns ``width..``: row b's pair j sees its own prefix and its
  own pairs up to j, at position ``committed[b] + j``. Each row's new entries are copied into its own cache
  (its next round starts there), and ONE drafting LM-head call gives every row's root distribution.
- ``expand``: each depth is one head forward over every row's nodes: row b's nodes see its visible columns
  and their own fed ancestors, at positions ``committed[b] + depth - 1``. The tree entries live in the
  stacked cache alone and are dropped with it; the rows' own caches never hold them.
- ``feed_block`` (what ``catch_up`` is made of, with no block): ONE forward over every row's pending entries and a
  block of m queries behind each row's own (per-row positions, the padding masked), the forward itself the
  drafter's (a feature-level head's ``forward_head``, P-EAGLE's K - 1 mask slots its block; DFlash's draft model,
  whose pending entries are context features injected as keys and values and send no query, its block seeing
  itself both ways; PARD's draft LM over token embeddings). The cache layout is the same for all of them (one
  (kv_heads, length, head_dim) buffer per layer and row), so the stacked cache and the write-back serve every
  drafter; a drafter's ``feed_backlog`` (a fresh prompt fed alone first) is its own.

A shared forward is timed in every row's ``spans`` (each row's draft forward time is the shared call's, as
each row's verify time is the shared verify's).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch

from eagle2.core.cache import new_cache
from eagle2.core.compiled import CompileUnsupportedError
from eagle2.core.tree import additive_mask
from eagle2.heads.static_head import forward_head


@contextmanager
def shared_span(runners):
    """One span, opened in every row's ``spans``."""
    with ExitStack() as stack:
        for r in runners:
            stack.enter_context(r.spans.span())
        yield


BACKLOG = 4  # pending pairs any row may feed in the shared catch-up (by default); see ``fed_alone``


def fed_alone(pending: list[int], backlog: int) -> list[bool]:
    """Which rows feed their backlog alone before the shared catch-up, given each row's pending count: a row past
    ``backlog`` pairs AND past twice the group's (lower) median, i.e. a fresh prompt among rows that drafted
    lately. Rows that fell behind together (the plain rounds of the round policy, ``eagle2.drafters.policy``)
    catch up in the one shared forward, padded to the longest: little padding, one forward instead of R."""
    limit = max(backlog, 2 * sorted(pending)[(len(pending) - 1) // 2])
    return [n > limit for n in pending]


class TreeHeads:
    """The head state of one drafting round over R rows (see the module's docstring)."""

    def __init__(self, runners, reserve: int = 64, backlog: int = BACKLOG):
        self.runners, self.lead = list(runners), runners[0]
        # the row alone in its own cache, unless the head is compiled for the batch (its B-row buffers)
        self.alone = len(self.runners) == 1 and getattr(self.lead.head, "static_batch", None) is None
        if self.alone:
            return
        if getattr(self.lead.head, "static_decoder", None) is not None:  # its one buffer holds one row
            raise CompileUnsupportedError("a draft head compiled for batch 1 drafts one row at a time: batched "
                                          "drafting needs it compiled for the batch (attach_head(head, rows=B))")
        for r, alone in zip(self.runners, fed_alone([len(r.pending_tokens) for r in self.runners], backlog)):
            if alone:  # a fresh prompt: all its pairs but the last fed in the row's own cache
                r.feed_backlog(leave=1)
        lead, device = self.lead, self.lead.device
        committed = [r.committed for r in self.runners]
        self.pending = torch.tensor([len(r.pending_tokens) for r in self.runners], device=device)  # (R,)
        self.width = max(committed)
        self.cache = stacked_cache(lead.head, [r.cache for r in self.runners], committed, self.width,
                                   reserve + int(self.pending.max()))
        self.committed = torch.tensor(committed, device=device)  # (R,) head positions before the pending pairs
        self.visible = torch.arange(self.width, device=device) < self.committed[:, None]  # (R, width)
        self._fed = 0
        self.fed_ancestors = torch.zeros(len(self.runners), 0, 0, dtype=torch.bool, device=device)  # (R, f, f)

    def pending_inputs(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every row's pending tokens (R, span) and features (R, span, F) (None: the rows read no features),
        padded with zeros to the longest (``span``)."""
        lead, device, rows = self.lead, self.lead.device, len(self.runners)
        span = int(self.pending.max())
        tokens = torch.zeros(rows, span, dtype=torch.long, device=device)
        for b, r in enumerate(self.runners):
            tokens[b, : len(r.pending_tokens)] = torch.tensor(r.pending_tokens, device=device)
        if not lead.pending_feats:
            return tokens, None
        feats = [torch.cat([f.to(device, lead.dtype) for f in r.pending_feats]) for r in self.runners]
        padded = feats[0].new_zeros((rows, span, feats[0].shape[-1]))
        for b, f in enumerate(feats):
            padded[b, : f.shape[0]] = f
        return tokens, padded

    def catch_up(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row feeds its pending pairs; returns (log-probs of the roots' children (R, V), the features
        predicted at the roots (R, H)): one head forward and one LM-head call for all rows."""
        if self.alone:  # ``HeadRunner.catch_up``, as ever
            logp = self.lead.catch_up()
            return logp[None], self.lead.root_feature[None]
        tokens, feats = self.pending_inputs()
        roots = self.feed_block(lambda positions, mask, cache: forward_head(self.lead.head, tokens, feats, positions,
                                                                            mask, cache), 0)[:, 0]  # (R, H)
        with shared_span(self.runners):
            return self.lead.log_probs_unspanned(roots), roots

    def feed_block(self, forward, m: int, *, context_queries: bool = True, bidirectional: bool = False):
        """ONE forward over every row's pending entries (padded to the longest, ``span``) and a block of ``m``
        queries behind each row's own: row b's pending entry j sits at position ``committed[b] + j``, its block
        slot i at ``committed[b] + pending[b] + i``. ``forward(positions (R, span + m), mask, cache)`` is the
        drafter's model call over its inputs (``pending_inputs`` and its block; ``mask`` (R, 1, Q, width + span +
        m) additive, keys in the order [the rows' past, pending, block]); it returns outputs (R, Q, H) at Q
        queries: the pending entries' then the block's with ``context_queries``, else the block's alone (DFlash:
        the context sends no query). A pending query sees the row's visible columns and its own pending entries
        up to itself; a block query sees those, every pending entry of its row and the block causally (or all of
        it, ``bidirectional``). Each row's pending entries are then written into its own cache (the row has caught
        up); the block lives in the stacked cache alone, masked from later queries. Returns the outputs at each
        row's last pending entry (with ``context_queries``) then at its block: (R, [1 +] m, H)."""
        device, rows, span = self.lead.device, len(self.runners), int(self.pending.max())
        positions, mask, real = self._layout(span, m, context_queries, bidirectional)
        with shared_span(self.runners):
            out = forward(positions, mask, self.cache)
        if context_queries:
            last = out[torch.arange(rows, device=device), self.pending - 1]  # (R, H)
            out = torch.cat([last[:, None], out[:, span:]], dim=1)
        self._write_back(span, out[:, 0])
        self.visible = torch.cat([self.visible, real, real.new_zeros(rows, m)], dim=1)  # (R, width + span + m)
        self.width += span + m
        self.committed = self.committed + self.pending
        self.pending = torch.zeros_like(self.pending)
        return out

    def _layout(self, span: int, m: int, context_queries: bool, bidirectional: bool):
        """(positions (R, span + m), additive mask (R, 1, Q, width + span + m), the rows' real pending entries
        (R, span)) of ``feed_block``."""
        lead, device, rows = self.lead, self.lead.device, len(self.runners)
        j, i = torch.arange(span, device=device), torch.arange(m, device=device)
        real = j < self.pending[:, None]  # (R, span): a row's own pending entries; the rest is padding
        block = torch.ones(m, m, dtype=torch.bool, device=device)
        block = (block if bidirectional else block.tril()).expand(rows, m, m)
        allowed = torch.cat([self.visible[:, None].expand(rows, m, self.width), real[:, None].expand(rows, m, span),
                             block], dim=2)  # the block's queries
        if context_queries:
            own = (j[:, None] >= j[None, :])[None] & real[:, None, :]  # entry j sees its row's entries up to j
            own |= torch.eye(span, dtype=torch.bool, device=device)  # a padding query sees itself (never an empty row)
            pending = torch.cat([self.visible[:, None].expand(rows, span, self.width), own,
                                 own.new_zeros(rows, span, m)], dim=2)
            allowed = torch.cat([pending, allowed], dim=1)
        mask = additive_mask(allowed, lead.dtype, device)[0, 0].unsqueeze(1)  # (R, 1, Q, width + span + m)
        positions = torch.cat([self.committed[:, None] + j, (self.committed + self.pending)[:, None] + i], dim=1)
        return positions, mask, real

    def _write_back(self, span: int, roots: torch.Tensor) -> None:
        """Each row's new entries into its own cache, behind its committed ones: the row has caught up."""
        for i, layer in enumerate(self.cache.layers):
            keys = layer.keys[:, :, self.width: self.width + span]
            values = layer.values[:, :, self.width: self.width + span]
            for b, r in enumerate(self.runners):
                n, own = len(r.pending_tokens), r.cache.layers[i]
                if not own.is_initialized:  # a row whose head never ran before
                    own.lazy_initialization(keys[b: b + 1], values[b: b + 1])
                own.place(r.committed, keys[b: b + 1, :, :n], values[b: b + 1, :, :n])
        for r, root in zip(self.runners, roots):
            r.caught_up(len(r.pending_tokens), root)

    @property
    def fed(self) -> int:
        """Tree nodes fed per row since the catch-up (equal for every row: each depth feeds n nodes a row)."""
        return self.lead.fed if self.alone else self._fed

    def expand(self, tokens: torch.Tensor, parent_fed, depth: int, parent_features: torch.Tensor):
        """Feed one depth's nodes of every row: ``tokens`` (R, n), ``parent_fed`` (R, n) fed indices of their
        parents (-1: the root) or one list shared by the rows, ``parent_features`` (R, n, H). Returns
        (log-probs of their children (R, n, V), their predicted features (R, n, H))."""
        if self.alone:  # the row's own head cache, as ``HeadRunner.expand``
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
        allowed = torch.cat([self.visible[:, None].expand(rows, n, self.width), new], dim=2)  # (R, n, width + f + n)
        mask = additive_mask(allowed, lead.dtype, device)[0, 0].unsqueeze(1)  # (R, 1, n, K)
        positions = (self.committed + depth - 1)[:, None].expand(rows, n)
        with shared_span(self.runners):
            out = forward_head(lead.head, tokens.to(device), parent_features, positions, mask, self.cache)  # (R, n, H)
            logp = lead.log_probs_unspanned(out.reshape(rows * n, -1))
        return logp.reshape(rows, n, -1), out


def stacked_cache(head, caches, lengths: list[int], width: int, reserve: int):
    """A head cache of R rows: row b holds the first ``lengths[b]`` entries of ``caches[b]`` (one row each; a
    row's cache may be empty, never written), zeros up to ``width`` (finite: masked out, never NaN), room for
    ``reserve`` more positions. A head compiled for the batch: its B-row buffers, loaded so."""
    static = getattr(head, "static_batch", None)
    if static is not None:
        return static.load(caches, lengths, width)
    config, param = head.config, next(head.parameters())
    kv_heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    out = new_cache(head)
    for i, layer in enumerate(out.layers):
        keys = param.new_zeros((len(caches), kv_heads, width, head_dim))  # (R, kv_heads, width, head_dim)
        values = torch.zeros_like(keys)
        for b, (cache, n) in enumerate(zip(caches, lengths)):
            if n:
                keys[b, :, :n] = cache.layers[i].keys[0, :, :n]
                values[b, :, :n] = cache.layers[i].values[0, :, :n]
        layer.lazy_initialization(keys, values)
        layer.reserve(width + reserve)
        layer.place(0, keys, values)
    return out
