"""The target's next-token logits at a batch's positions, each computed once and read by every loss that needs them.

A distillation loss fits a head to the target's distribution at positions p of a batch, ``softmax(lm_head(f[p]))``
over a vocabulary: the full one, or the rows of a drafting vocabulary (the target's distribution renormalised over
them). That LM-head product is the largest single cost of such a loss on a 49k vocabulary, and the same positions
come back: at every unrolled step (HASS, EAGLE-3), in the agreement stats, in EAGLE-3's out-of-vocabulary mask and,
in a joint run (``objectives/joint.py``), in every member. ``TargetLogits`` holds one batch's features and computes
a position's logits the first time a loss asks for them, kept in the product's own dtype (under bf16 the logits
are bf16, as every loss read them before), so each later read is a gather:

- alone (``target_logits(batch)`` on a batch that carries none: a loss trained by its own stage), a vocabulary is
  its own product (a drafting vocabulary costs its share of the full one);
- shared (``share_target_logits(batch)``: the joint step), the full vocabulary's product is made once per LM head
  and dtype, and each vocabulary is its columns of it.

It knows nothing of any head; it never holds a gradient (the target side of every loss is a constant).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class TargetLogits:
    """The target's logits at the flat positions (``b * L + j``) of features (B, L, H), computed on first use."""

    def __init__(self, features: torch.Tensor, shared: bool = False):
        self.shape = tuple(features.shape[:2])  # (B, L)
        self.flat = features.detach().flatten(0, 1)  # (B*L, H)
        self.shared = shared
        self._tables: dict[tuple, _Table] = {}

    def positions(self, step: int = 0) -> torch.Tensor:
        """(B, L - step) the flat position of ``features[:, step:]``: index it as the features are indexed."""
        b, length = self.shape
        return torch.arange(b * length, device=self.flat.device).view(b, length)[:, step:]

    @torch.no_grad()
    def __call__(self, proj, at: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(N, V) fp32 logits at flat positions ``at`` (N,) through the LM head ``proj`` (``losses.LossProjection``)
        over its vocabulary, or over the target ids ``vocab_ids`` of a full-vocabulary ``proj``."""
        if vocab_ids is not None and proj.vocab_ids is not None:
            raise ValueError("vocab_ids restrict a full-vocabulary projection, not a restricted one")
        vocab = proj.vocab_ids if vocab_ids is None else vocab_ids.to(self.flat.device)
        if self.shared:  # one full-vocabulary table per LM head and dtype, each vocabulary its columns
            full = proj.full()
            rows = self._table((id(proj.lm_head), full.weight.dtype), lambda: (full.weight, full.bias, None))
            rows = rows.rows_at(self.flat, at)
            return (rows if vocab is None else rows[:, vocab]).float()
        key = (id(proj.lm_head), proj.weight.dtype, None if vocab is None else id(vocab))
        own = (lambda: (proj.weight, proj.bias, vocab)) if vocab_ids is None else (
            lambda: (proj.weight[vocab], None if proj.bias is None else proj.bias[vocab], vocab))
        return self._table(key, own).rows_at(self.flat, at).float()

    def _table(self, key: tuple, product) -> _Table:
        """The table of ``key``, made on first use from ``product()``: (weight, bias, vocabulary)."""
        if key not in self._tables:
            self._tables[key] = _Table(*product(), len(self.flat), self.flat.device)
        return self._tables[key]


class _Table:
    """One vocabulary's logits at the positions asked for so far: ``rows[row_of[p]]`` is position p's."""

    def __init__(self, weight, bias, vocab, positions: int, device):
        self.weight, self.bias, self.vocab = weight, bias, vocab  # (``vocab`` kept: its id is the table's key)
        self.row_of = torch.full((positions,), -1, dtype=torch.long, device=device)
        self.rows: torch.Tensor | None = None

    def rows_at(self, flat: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        missing = at[self.row_of[at] < 0].unique()
        if len(missing) or self.rows is None:
            new = F.linear(flat[missing].to(self.weight.dtype), self.weight, self.bias)
            start = 0 if self.rows is None else len(self.rows)
            self.row_of[missing] = torch.arange(start, start + len(missing), device=at.device)
            self.rows = new if self.rows is None else torch.cat([self.rows, new])
        return self.rows[self.row_of[at]]


def target_logits(batch: dict) -> TargetLogits:
    """The batch's shared logits (``share_target_logits``), else new ones for this loss alone."""
    shared = batch.get("target_logits")
    return shared if shared is not None else TargetLogits(batch["features"])


def share_target_logits(batch: dict) -> dict:
    """``batch`` with one ``TargetLogits`` every loss reading it shares (the joint step: one per batch)."""
    return {**batch, "target_logits": TargetLogits(batch["features"], shared=True)}
