"""An independent reference for the sampling transform (temperature, top-k, top-p), written from the
definitions in float64 with plain Python loops, sharing no code with ``eagle2.core.sampling``.

The certification tests take the target's distribution from here, so an error in
``probabilities()`` cannot hide in both the reference and the code under test.

Definitions (each applied to one row of logits):
- temperature T > 0: softmax(logits / T); T = 0 is greedy: all mass on the largest logit (shared
  equally by exact ties, the limit T -> 0).
- top-k (k > 0): keep the tokens whose logit is at least the k-th largest (ties at the k-th all kept).
- top-p (p < 1): keep every token whose probability is larger than or equal to that of the last token
  needed to reach mass p, taken from the most likely down: token i stays iff the mass of the tokens
  strictly more likely than it is below p (so tied tokens stay or go together, and a token reached
  with exactly p above it goes).
"""

from __future__ import annotations

import math

import torch


def _row(logits: list[float], temperature: float, top_p: float, top_k: int) -> list[float]:
    n = len(logits)
    keep = [True] * n
    if top_k and top_k < n:
        kth = sorted(logits, reverse=True)[top_k - 1]
        keep = [x >= kth for x in logits]
    if temperature <= 0:
        best = max(x for x, k in zip(logits, keep) if k)
        weights = [1.0 if k and x == best else 0.0 for x, k in zip(logits, keep)]
    else:
        top = max(x for x, k in zip(logits, keep) if k)
        weights = [math.exp((x - top) / temperature) if k else 0.0 for x, k in zip(logits, keep)]
    total = math.fsum(weights)
    probs = [w / total for w in weights]
    if top_p < 1.0:
        above = [math.fsum(q for q in probs if q > p) for p in probs]
        probs = [p if a < top_p else 0.0 for p, a in zip(probs, above)]
        total = math.fsum(probs)
        probs = [p / total for p in probs]
    return probs


def reference_probabilities(logits: torch.Tensor, temperature: float, top_p: float = 1.0,
                            top_k: int = 0) -> torch.Tensor:
    """(..., V) logits -> (..., V) float64 probabilities, computed from the definitions above."""
    rows = logits.detach().double().cpu().reshape(-1, logits.shape[-1]).tolist()
    out = [_row(r, float(temperature), float(top_p), int(top_k)) for r in rows]
    return torch.tensor(out, dtype=torch.float64).reshape(logits.shape)


def reference_for(logits: torch.Tensor, params) -> torch.Tensor:
    """``reference_probabilities`` with the settings of a ``SamplingParams``."""
    return reference_probabilities(logits, params.temperature, params.top_p, params.top_k)
