"""Acceptance: from a verified DraftTree to the accepted path plus one bonus/correction token.

``p_target`` is always the target model's distribution (after temperature/top-k/top-p), ``q_draft``
the drafter's. Rules:
- greedy: follow the child whose token equals the target's argmax at its parent; the bonus token
  is the target's argmax at the last accepted node.
- stochastic, per node, trying children in sibling order against a residual r (initially p_target):
  * a deterministically chosen child x (no q_draft): accept with probability r(x); on rejection
    set r(x) = 0 and renormalise;
  * a sampled child x ~ q: accept with probability min(1, r(x) / q(x)); on rejection
    r = norm(max(0, r - q)).
  When every child is rejected (or there is none) the token is sampled from r. Both are the
  standard lossless speculative-sampling rule; a chain of sampled drafts is vanilla SpS.
"""

from __future__ import annotations

import torch

from eagle2.tree import DraftTree


def accept_greedy(tree: DraftTree, target_logits: torch.Tensor) -> tuple[list[int], int]:
    """Returns (accepted node indices, root excluded; bonus token)."""
    best = target_logits.argmax(-1).tolist()  # (N,)
    tokens = tree.tokens.tolist()
    node, path = 0, []
    while True:
        nxt = next((c for c in tree.children[node] if tokens[c] == best[node]), None)
        if nxt is None:
            return path, best[node]
        path.append(nxt)
        node = nxt


def _normalise(r: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    total = r.sum()
    return r / total if total > 0 else fallback


def accept_stochastic(tree: DraftTree, p_target: torch.Tensor, generator: torch.Generator | None
                      ) -> tuple[list[int], int]:
    """p_target (N, V): the target's distribution at every node. Returns (path, bonus token)."""
    tokens = tree.tokens.tolist()
    node, path = 0, []
    while True:
        residual = p_target[node]
        accepted = None
        for child in tree.children[node]:
            x = tokens[child]
            u = float(torch.rand((), generator=generator))
            if tree.q_draft is None:
                if u < float(residual[x]):
                    accepted = child
                    break
                residual = residual.clone()
                residual[x] = 0.0
                residual = _normalise(residual, p_target[node])
            else:
                q = tree.q_draft[child]
                if float(q[x]) > 0 and u * float(q[x]) < float(residual[x]):
                    accepted = child
                    break
                residual = _normalise((residual - q).clamp_min(0.0), p_target[node])
        if accepted is None:
            return path, int(torch.multinomial(residual, 1, generator=generator))
        path.append(accepted)
        node = accepted
