"""A suffix tree of token sequences, truncated at ``max_depth`` and counted, as SuffixDecoding uses it
(Oliaro et al., 2024): every window of up to ``max_depth`` tokens of every added sequence is a path from
the root, and a node's count is how many windows pass through it (how often its tokens occurred).

Sequences are added token by token through a cursor (the nodes of that sequence's still-growing
suffixes), so several sequences can grow in one tree at once. ``match`` finds the longest suffix of a
context that occurred with a continuation; ``speculate`` grows the most likely continuations from there,
best first, by path probability (the product of each node's count over its parent's). Stored as one
uncompressed trie (a node per token), which a compressed suffix tree would only make smaller. Knows
nothing about models or draft trees.
"""

from __future__ import annotations

import heapq


class SuffixTree:
    def __init__(self, max_depth: int = 24):
        if max_depth < 2:
            raise ValueError("a suffix tree needs max_depth >= 2 (a pattern and a continuation)")
        self.max_depth = max_depth
        self.children: list[dict[int, int]] = [{}]
        self.count: list[int] = [0]
        self.depth: list[int] = [0]

    def extend(self, cursor: list[int], tokens) -> list[int]:
        """Append ``tokens`` to the sequence whose open suffixes are ``cursor`` (start a sequence with
        ``[]``); returns the new cursor."""
        for token in tokens:
            token, grown = int(token), []
            for node in cursor + [0]:
                child = self.children[node].get(token)
                if child is None:
                    child = len(self.count)
                    self.children[node][token] = child
                    self.children.append({})
                    self.count.append(0)
                    self.depth.append(self.depth[node] + 1)
                self.count[child] += 1
                if self.depth[child] < self.max_depth:
                    grown.append(child)
            cursor = grown
        return cursor

    def match(self, context: list[int]) -> tuple[int, int]:
        """(node, length) of the longest suffix of ``context`` that occurred followed by a token;
        (0, 0) for none."""
        for length in range(min(len(context), self.max_depth - 1), 0, -1):
            node = 0
            for token in context[-length:]:
                node = self.children[node].get(int(token), -1)
                if node < 0:
                    break
            if node > 0 and self.children[node]:
                return node, length
        return 0, 0

    def speculate(self, node: int, max_nodes: int, min_prob: float) -> tuple[list[tuple[int, ...]], list[int], float]:
        """The most likely continuations below ``node``: up to ``max_nodes`` paths, best first (each after
        its parent), each with path probability >= ``min_prob``; their counts; the sum of their path
        probabilities (the expected accepted tokens if the estimates were exact)."""
        paths, counts, score = [], [], 0.0
        heap = [(-1.0, 0, node, ())]  # (-path probability, tie-break, node, path)
        tie = 1
        while heap and len(paths) < max_nodes:
            neg, _, at, path = heapq.heappop(heap)
            if path:
                paths.append(path)
                counts.append(self.count[at])
                score -= neg
            for token, child in self.children[at].items():
                prob = -neg * self.count[child] / self.count[at]
                if prob >= min_prob:
                    heapq.heappush(heap, (-prob, tie, child, path + (token,)))
                    tie += 1
        return paths, counts, score
