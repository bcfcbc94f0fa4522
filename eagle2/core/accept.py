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
Every random choice is one ``Draws`` call (``eagle2.core.sampling``): a coin per tried child, then one
categorical draw for the bonus/correction token; a test can pass its own ``Draws`` to enumerate them.

Host syncs: per node on the accepted path, the target's distribution there and the drafts' at its
children come to the host in ONE transfer (``node_rows``); the siblings are then tried on host tensors.
A round costs one transfer per accepted depth plus one, not one per sibling tried (on a CPU the
transfer is a no-op and every value is what it was).
"""

from __future__ import annotations

import torch

from eagle2.core.sampling import Draws, as_draws
from eagle2.core.tree import DraftTree


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


def _try_child(residual: torch.Tensor, x: int, q: torch.Tensor | None, p_node: torch.Tensor,
               draws: Draws) -> tuple[bool, torch.Tensor]:
    """One child with token x against the residual: (accepted?, the residual for the next sibling)."""
    if q is None:  # chosen deterministically: accept with probability r(x)
        if draws.accept(float(residual[x])):
            return True, residual
        residual = residual.clone()
        residual[x] = 0.0
        return False, _normalise(residual, p_node)
    if draws.accept(float(residual[x]), float(q[x])):  # sampled from q: min(1, r(x) / q(x))
        return True, residual
    return False, _normalise((residual - q).clamp_min(0.0), p_node)


def node_rows(p_target: torch.Tensor, q_draft: torch.Tensor | None, node: int, children: list[int]
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the target's distribution at ``node`` (V,), the drafts' at its ``children`` (len, V) or None), on
    the host in one transfer (the drafts' rows first joined to the target's device and dtype)."""
    rows = p_target[node:node + 1]
    if q_draft is not None and children:
        rows = torch.cat([rows, q_draft[children].to(rows.device, rows.dtype)])
    host = rows.cpu()
    return host[0], (host[1:] if q_draft is not None else None)


def accept_stochastic(tree: DraftTree, p_target: torch.Tensor, generator: torch.Generator | Draws | None
                      ) -> tuple[list[int], int]:
    """p_target (N, V): the target's distribution at every node. Returns (path, bonus token).

    ``generator``: a torch.Generator or None (torch's random stream), or any ``Draws``."""
    draws = as_draws(generator)
    tokens = tree.tokens.tolist()
    node, path = 0, []
    while True:
        children = tree.children[node]
        p_node, q_rows = node_rows(p_target, tree.q_draft, node, children)  # this depth's one transfer
        residual = p_node
        for i, child in enumerate(children):
            q = None if q_rows is None else q_rows[i]
            accepted, residual = _try_child(residual, tokens[child], q, p_node, draws)
            if accepted:
                path.append(child)
                node = child
                break
        else:  # every child rejected, or none: the token comes from the residual
            return path, draws.categorical(residual)
