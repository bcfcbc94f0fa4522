"""One definition of draft/target agreement: top-k agreement and chain acceptance (tau), for the trainer's
validation rows, the eval stage's ``eval.json`` and so the head cards (which read ``eval.json``).

Its job is to make the trainer's figures and the evaluator's the same number when they see the same
sequences. The rules, all here:

- counted positions: head position ``j`` (it reads ``(t[j+1], f[j])`` and predicts the target's next
  token after ``t[j+1]``) counts when ``f[j+1]`` is an answer position, ``j + 1 >= start`` (or, for
  sequences with several answers, ``answer[j+1]``), and is not padding (``counted_positions``); the
  prompt (and a later user turn) is context only;
- the target's token: ``argmax lm_head(f[j+1])`` over the FULL vocabulary (``target_ids``);
- the draft's tokens: its ``k`` best, mapped to target ids through ``vocab_ids`` when it drafts over a
  restricted vocabulary, so a target token outside that vocabulary is a miss, never dropped (``ranked_ids``);
- means are per token (position-weighted), over all counted positions of all sequences (``Tally``);
  a draft step ``s >= 2`` is weighted by its own count ``n_s{s}``, not by step 1's;
- chain acceptance: the accepted length of a greedy chain is its longest prefix equal to the true
  continuation; ``tau = 1 + sum_d P(length >= d)`` (``accepted_lengths``, ``chain_summary``).

Precision is the caller's: validation and evaluation pass fp32 logits (``LossProjection.exact``).
Knows nothing of heads, batches on disk or configs.
"""

from __future__ import annotations

import re

import torch

_STEP_KEY = re.compile(r"_s(\d+)$")  # top1_s2: an unrolled draft step's figure, counted by n_s2


def counted_positions(valid: torch.Tensor, start: torch.Tensor, answer: torch.Tensor | None = None) -> torch.Tensor:
    """(B, L-1) bool: head position ``j`` counts when ``f[j+1]`` is a real answer position.
    ``valid`` (B, L) marks real (unpadded) tokens, ``start`` (B,) the first answer index; ``answer``
    (B, L) bool, when given, marks the answer tokens instead (several answers per sequence)."""
    if answer is not None:
        return valid[:, 1:] & answer[:, 1:]
    pos = torch.arange(valid.shape[1] - 1, device=valid.device)
    return valid[:, 1:] & (pos[None] + 1 >= start[:, None])


def ranked_ids(logits: torch.Tensor, k: int, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
    """(N, k) target token ids of the draft's ``k`` best (ties: the lowest index, as ``argmax``);
    ``vocab_ids`` maps a restricted draft vocabulary's indices to target ids."""
    top = logits.topk(k, dim=-1).indices if k > 1 else logits.argmax(-1, keepdim=True)
    return top if vocab_ids is None else vocab_ids.to(top.device)[top]


def target_ids(target_logits: torch.Tensor) -> torch.Tensor:
    """(N,) the target's next token: the argmax of its logits over the full vocabulary."""
    return target_logits.argmax(-1)


def agreement_counts(ranked: torch.Tensor, want: torch.Tensor, mask: torch.Tensor | None = None,
                     ks=(1, 4)) -> dict[str, int]:
    """``{"n": counted positions, "top{k}": hits}``: a hit when ``want`` is among the first ``k`` of
    ``ranked`` (N, >= max(ks)) target ids; ``mask`` (N,) selects the counted rows (None: all)."""
    if ranked.dim() == 1:
        ranked = ranked[:, None]
    if mask is not None:
        ranked, want = ranked[mask], want[mask]
    hit = ranked == want[:, None]  # (N, k)
    return {"n": int(want.numel()), **{f"top{k}": int(hit[:, :k].any(-1).sum()) for k in ks}}


def as_means(counts: dict[str, int], suffix: str = "") -> dict[str, float]:
    """Counts -> the logged stats: ``top{k}`` shares, and the count as ``n`` (``n_s{s}`` for a step)."""
    n = counts["n"]
    means = {f"{key}{suffix}": hits / max(n, 1) for key, hits in counts.items() if key != "n"}
    return means | {"n" + suffix: n}


def agreement(logits: torch.Tensor, target_logits: torch.Tensor, mask: torch.Tensor | None = None, *,
              ks=(1, 4), vocab_ids: torch.Tensor | None = None) -> dict[str, float]:
    """Top-k agreement of draft ``logits`` (N, V_draft) with the target's argmax of ``target_logits``
    (N, V): ``{"top1": .., "top4": .., "n": ..}`` over the ``mask`` rows."""
    counts = agreement_counts(ranked_ids(logits, max(ks), vocab_ids), target_ids(target_logits), mask, ks)
    return as_means(counts)


class Tally:
    """Position-weighted means of loss stats over batches: each key weighted by its count (``n``, or
    ``n_s{s}`` for a key ending in ``_s{s}`` when the batch gives one); ``positions`` is the total ``n``."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.positions = 0

    def add(self, stats: dict) -> None:
        n = stats["n"]
        self.positions += n
        for key, value in stats.items():
            name = key.rsplit("/", 1)[-1]  # (a joint run's ``eagle3/top1_s2`` is counted by ``eagle3/n_s2``)
            if name == "n" or name.startswith("n_"):
                continue
            step = _STEP_KEY.search(name)
            w = stats.get(f"{key[:len(key) - len(name)]}n_s{step.group(1)}", n) if step else n
            self.sums[key] = self.sums.get(key, 0.0) + value * w
            self.weights[key] = self.weights.get(key, 0.0) + w

    def means(self) -> dict[str, float]:
        return {k: v / max(self.weights[k], 1) for k, v in self.sums.items()} | {"positions": self.positions}


def accepted_lengths(drafted: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """(A,) accepted length of each greedy chain: the longest prefix of ``drafted`` (A, depth) equal to
    the true continuation ``truth`` (A, depth)."""
    return (drafted == truth).long().cumprod(dim=1).sum(dim=1)


def chain_summary(lengths: torch.Tensor, depth: int) -> dict:
    """``{"anchors", "accept_ge": {d: P(length >= d)}, "tau": 1 + sum_d P(length >= d)}`` over the
    accepted ``lengths`` of all anchors (every anchor counts once)."""
    counts = torch.bincount(lengths.long().cpu(), minlength=depth + 1)
    total = int(counts.sum())
    at_least = [float(counts[d:].sum()) / max(total, 1) for d in range(1, depth + 1)]
    return {"anchors": total, "accept_ge": {str(d): p for d, p in zip(range(1, depth + 1), at_least)},
            "tau": 1.0 + sum(at_least)}
