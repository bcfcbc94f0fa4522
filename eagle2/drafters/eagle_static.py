"""EAGLE (static tree): a fixed tree shape given as choice paths.

Path [i, j] is the j-th most likely child of the node reached by path [i]. The head runs depth by
depth, feeding only the nodes that have children in the shape.
"""

from __future__ import annotations

import torch

from eagle2.core.tree import DraftTree, choice_paths
from eagle2.drafters.eagle_common import HeadRunner, drafting_settings, path_log_values, tree_from_drafted


class EagleStaticDrafter(HeadRunner):
    def __init__(self, head, lm_head, device, *, choices: list[list[int]], **drafting):
        super().__init__(head, lm_head, device, **drafting)
        paths = choice_paths(choices)
        index = {p: i for i, p in enumerate(paths)}
        self.paths = paths
        self.parent = torch.tensor([index[p[:-1]] if len(p) > 1 else -1 for p in paths])
        self.rank = torch.tensor([p[-1] for p in paths])
        self.depth = torch.tensor([len(p) for p in paths])
        self.max_rank = int(self.rank.max()) + 1

    def propose(self, root: int, room: int) -> DraftTree:
        n = len(self.paths)
        tokens = torch.zeros(n, dtype=torch.long)
        log_conf = torch.zeros(n)
        fed_of = torch.full((n,), -1)  # fed index of each node once it is fed to the head
        logp_of = {-1: self.catch_up()}  # node -> log-probs of its children
        feat_of = {-1: self.root_feature}
        for d in range(1, int(self.depth.max()) + 1):
            layer = (self.depth == d).nonzero()[:, 0]
            for i in layer.tolist():  # pick each node's token: rank-th best child of its parent
                top_tokens, top_conf = self.top(logp_of[int(self.parent[i])], self.max_rank)
                tokens[i], log_conf[i] = top_tokens[self.rank[i]], top_conf[self.rank[i]]
            has_children = [i for i in layer.tolist() if (self.parent == i).any()]
            if not has_children:
                break
            parents_fed = [int(fed_of[self.parent[i]]) if self.parent[i] >= 0 else -1 for i in has_children]
            first_fed = len(self.fed_parent)
            feats_in = torch.stack([feat_of[int(self.parent[i])] for i in has_children])
            logp, feats = self.expand(tokens[has_children].tolist(), parents_fed, d, feats_in)
            for row, i in enumerate(has_children):
                fed_of[i] = first_fed + row
                logp_of[i], feat_of[i] = logp[row], feats[row]
        keep = torch.arange(min(n, max(room - 1, 0)))
        return tree_from_drafted(root, tokens, self.parent, self.depth, self.rank, log_conf,
                                 path_log_values(self.parent, log_conf), keep)


def build(method_cfg, target, params, generator, weights: dict) -> EagleStaticDrafter:
    head = weights["head"]
    return EagleStaticDrafter(head, target.lm_head, target.device, choices=list(method_cfg.choices),
                              **drafting_settings(method_cfg, head))
