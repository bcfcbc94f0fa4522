"""A draft tree from counted continuations: the shared last step of the retrieval drafters (REST,
SuffixDecoding), which score a node by how often its token sequence followed the matched context.

``tree_from_counts`` takes the chosen nodes as token paths from the root (parents before children,
siblings best-first) with their counts, and returns the ``DraftTree`` with each node's confidence
(its count over its parent's: the frequency estimate of P(token | path)) and per-node records (depth,
sibling rank, confidence, path value = count over the root's count). Knows nothing of where the counts
come from.
"""

from __future__ import annotations

import torch

from eagle2.core.tree import DraftTree

Path = tuple[int, ...]  # tokens from the root's child down to the node


def tree_from_counts(root: int, paths: list[Path], counts: list[int], root_count: int, **meta) -> DraftTree:
    """The tree of ``paths`` (closed under taking prefixes, each prefix listed before its extensions,
    siblings in the order they should be tried), scored by ``counts``; ``root_count``: the count every
    depth-1 count is a share of."""
    index: dict[Path, int] = {(): 0}
    tokens, parents, conf, value, depth, rank = [root], [-1], [1.0], [], [], []
    count_of = {(): root_count, **dict(zip(paths, counts))}
    siblings = [0]
    for path, count in zip(paths, counts):
        parent = index.get(path[:-1])
        if parent is None:
            raise ValueError(f"draft path {path} is listed before its parent")
        index[path] = len(tokens)
        tokens.append(path[-1])
        parents.append(parent)
        siblings.append(0)
        rank.append(siblings[parent])
        siblings[parent] += 1
        conf.append(count / count_of[path[:-1]])
        value.append(count / root_count)
        depth.append(len(path))
    tree = DraftTree(torch.tensor(tokens), torch.tensor(parents), confidence=torch.tensor(conf), meta=meta)
    if paths:
        tree.records = {"depth": depth, "rank": rank, "confidence": conf[1:], "value": value,
                        "tree_index": list(range(1, len(tokens))), "parent_tree_index": parents[1:]}
    return tree
