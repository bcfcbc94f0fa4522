"""Deliberately broken verification rules, patched in by the negative controls of the losslessness tests
(a test of a correctness property must fail on a broken implementation)."""

from __future__ import annotations


def accept_second_choice_too(tree, target_logits):
    """BROKEN greedy rule: a drafted child is accepted when its token is the target's first OR second
    choice. Same signature and return as ``eagle2.core.engine.accept_greedy``."""
    top2 = target_logits.topk(2, dim=-1).indices.tolist()
    tokens = tree.tokens.tolist()
    node, path = 0, []
    while True:
        nxt = next((c for c in tree.children[node] if tokens[c] in top2[node]), None)
        if nxt is None:
            return path, top2[node][0]
        path.append(nxt)
        node = nxt
