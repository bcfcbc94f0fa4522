"""DraftTree: the data contract between drafters and the verifier.

Node 0 is the root: the last committed token, not yet in the target's KV cache. Every other node is
a drafted token whose parent has a smaller index (topological order). Children of a node are tried
in index order, so drafters list siblings best-first. A chain is a tree with one child per node;
plain decoding is the root alone.

From the tree come the ancestor-only additive attention mask, the position ids (prefix length +
depth), and root-to-leaf paths. ``q_draft`` (N, V) holds, for stochastic drafts, the distribution
each node's token was sampled from; when it is None the children were chosen deterministically
(EAGLE's top-k expansion). ``records`` optionally carries per-node logs of every drafted node
(including ones not kept for verification); the engine fills in acceptance.

Non-candidate nodes (``candidate`` False) ride in the verify forward with the same ancestor mask and
positions but are never accepted: ``children``, the only view of the tree the acceptance rule reads, lists
candidates only, and a candidate must descend from candidates alone. A drafter reads the target's outputs
at them through its ``observe_target`` hook (``eagle2.drafters.base``); Lookahead decoding's Jacobi window
is such a set of nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype, device=None) -> torch.Tensor:
    """(1, 1, Q, K) additive float mask from a (Q, K) bool matrix: 0 where allowed, dtype's min elsewhere.
    Every attention mask of the project (tree verification, head drafting, head training) is built here."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~allowed.to(device), torch.finfo(dtype).min)[None, None]


@dataclass
class DraftTree:
    tokens: torch.Tensor  # (N,) long; tokens[0] is the root
    parents: torch.Tensor  # (N,) long; parents[0] == -1
    confidence: torch.Tensor | None = None  # (N,) draft probability of each node given its parent
    q_draft: torch.Tensor | None = None  # (N, V) distribution node i was sampled from (stochastic drafts)
    records: dict | None = None  # per drafted node: depth, rank, confidence, value, tree_index
    meta: dict = field(default_factory=dict)  # per-round facts a drafter wants logged (e.g. budget)
    candidate: torch.Tensor | None = None  # (N,) bool: False marks a node verified but never accepted; None: all

    def __post_init__(self):
        parents = self.parents.tolist()
        if not parents or parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
            raise ValueError("DraftTree needs parents[0] == -1 and 0 <= parents[i] < i for every other node")
        self._parents = parents
        candidate = [True] * len(parents) if self.candidate is None else self.candidate.tolist()
        if len(candidate) != len(parents) or not candidate[0]:
            raise ValueError("DraftTree.candidate needs one flag per node, the root's True")
        depth = [0] * len(parents)
        children: list[list[int]] = [[] for _ in parents]  # candidate children only: what acceptance sees
        for i in range(1, len(parents)):
            depth[i] = depth[parents[i]] + 1
            if candidate[i]:
                if not candidate[parents[i]]:
                    raise ValueError(f"DraftTree node {i} is a candidate under a non-candidate node")
                children[parents[i]].append(i)
        self._depth = depth
        self.children = children

    @classmethod
    def root_only(cls, token: int) -> "DraftTree":
        return cls(torch.tensor([token]), torch.tensor([-1]))

    @classmethod
    def chain(cls, root: int, drafted: list[int], **kw) -> "DraftTree":
        n = len(drafted) + 1
        return cls(torch.tensor([root, *drafted]), torch.arange(-1, n - 1), **kw)

    def __len__(self) -> int:
        return len(self._parents)

    @property
    def depths(self) -> torch.Tensor:
        return torch.tensor(self._depth)

    def ancestor_matrix(self) -> torch.Tensor:
        """(N, N) bool: [i, j] is True when j is i or an ancestor of i."""
        n = len(self)
        anc = torch.eye(n, dtype=torch.bool)
        for i in range(1, n):
            anc[i] |= anc[self._parents[i]]
        return anc

    def attention_mask(self, prefix_len: int, dtype: torch.dtype, device=None) -> torch.Tensor | None:
        """Additive (1, 1, N, prefix_len + N) float mask; None for the root alone (sees everything)."""
        n = len(self)
        if n == 1:
            return None
        allowed = torch.cat([torch.ones(n, prefix_len, dtype=torch.bool), self.ancestor_matrix()], dim=1)
        return additive_mask(allowed, dtype, device)

    def position_ids(self, prefix_len: int, device=None) -> torch.Tensor:
        return (self.depths + prefix_len)[None].to(device)

    def non_candidates(self) -> list[int]:
        """Indices of the nodes that are verified but never accepted."""
        return [] if self.candidate is None else (~self.candidate).nonzero().flatten().tolist()

    def verify_inputs(self, prefix_len: int, dtype: torch.dtype, device=None):
        """(tokens (1, N), the additive mask of ``attention_mask`` or None, position ids (1, N)) on ``device``,
        from ONE host-to-device copy (tokens, depths and the ancestor matrix packed together: on a GPU each
        blocking copy from host memory is a sync); the mask is then built on the device."""
        n = len(self)
        positions = self.position_ids(prefix_len)[0]  # on the host: copied with the rest
        packed = torch.cat([self.tokens[:, None], positions[:, None], self.ancestor_matrix().long()], dim=1)
        packed = packed.to(device)  # (N, 2 + N)
        tokens, positions = packed[:, 0][None], packed[:, 1][None]
        if n == 1:
            return tokens, None, positions
        allowed = torch.cat([torch.ones(n, prefix_len, dtype=torch.bool, device=packed.device), packed[:, 2:] > 0], 1)
        return tokens, additive_mask(allowed, dtype, packed.device), positions

    def paths(self) -> list[list[int]]:
        """Root-to-leaf node-index paths through candidate nodes."""
        out, excluded = [], set(self.non_candidates())
        for leaf in (i for i, ch in enumerate(self.children) if not ch and i not in excluded):
            path = [leaf]
            while self._parents[path[-1]] != -1:
                path.append(self._parents[path[-1]])
            out.append(path[::-1])
        return out


def choice_paths(choices) -> list[tuple[int, ...]]:
    """Distinct paths sorted by (depth, ranks): parents first, siblings contiguous and best-first;
    every path's parent path must be present."""
    paths = sorted({tuple(int(c) for c in p) for p in choices}, key=lambda p: (len(p), p))
    if not paths or any(len(p) == 0 or min(p) < 0 for p in paths):
        raise ValueError("method.choices must be non-empty paths of non-negative ranks")
    present = set(paths)
    missing = [list(p) for p in paths if len(p) > 1 and p[:-1] not in present]
    if missing:
        raise ValueError(f"method.choices has paths whose parent path is absent: {missing}")
    return paths
