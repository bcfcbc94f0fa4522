"""N-gram lookup in the tokens so far (prompt + output): what followed earlier occurrences of the
sequence's last n tokens. Used by prompt lookup decoding (``eagle2.drafters.pld``) and by EAGLE-2's
lookup branch (``method.lookup_branch``). Knows nothing about models or trees' verification: it
returns token chains, and ``chains_to_tree`` merges chains into one DraftTree (a trie).

Matching, as in prompt lookup decoding (Saxena, 2023; transformers' ``PromptLookupCandidateGenerator``):
for n from ``max_ngram`` down to ``min_ngram``, every earlier position where the last n tokens occur
proposes the (up to ``k``) tokens that followed it; the most recent occurrence first, longer n before
shorter, continuations already proposed (or a prefix of one already proposed) skipped, until
``branches`` chains are found.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from eagle2.core.tree import DraftTree


@dataclass(frozen=True)
class LookupSettings:
    k: int = 4  # tokens per proposed chain
    max_ngram: int = 3
    min_ngram: int = 1
    branches: int = 1  # distinct chains to propose

    def __post_init__(self):
        if self.k < 1 or self.branches < 1 or not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError("lookup needs k >= 1, branches >= 1 and 1 <= min_ngram <= max_ngram")


def find_chains(sequence: list[int] | np.ndarray, settings: LookupSettings) -> list[list[int]]:
    """Up to ``settings.branches`` continuations (each 1..k tokens) of the sequence's last n-gram, best first."""
    seq = np.asarray(sequence, dtype=np.int64)
    chains: list[list[int]] = []
    for n in range(settings.max_ngram, settings.min_ngram - 1, -1):
        if len(seq) <= n:
            continue
        windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)  # starts 0 .. L-1-n: a token follows
        for start in np.flatnonzero((windows == seq[-n:]).all(axis=1))[::-1]:  # most recent first
            chain = seq[start + n: start + n + settings.k].tolist()
            if not any(old[: len(chain)] == chain for old in chains):
                chains.append(chain)
                if len(chains) == settings.branches:
                    return chains
    return chains


def chains_to_tree(root: int, chains: list[list[int]], max_nodes: int, **kw) -> DraftTree:
    """One tree rooted at ``root`` holding the chains as a trie (shared prefixes once), earlier chains'
    nodes first so that siblings are best-first; at most ``max_nodes`` drafted nodes."""
    tokens, parents, index = [root], [-1], {}  # index: (parent node, token) -> node
    for chain in chains:
        node = 0
        for token in chain:
            if (node, token) not in index:
                if len(tokens) - 1 == max_nodes:
                    break
                index[node, token] = len(tokens)
                tokens.append(token)
                parents.append(node)
            node = index[node, token]
    return DraftTree(torch.tensor(tokens), torch.tensor(parents), **kw)
