"""EAGLE (static tree): a fixed tree shape given as choice paths.

Path [i, j] is the j-th most likely child of the node reached by path [i]. The head runs depth by
depth, feeding only the nodes that have children in the shape.
"""

from __future__ import annotations

import torch

from eagle2.core.tree import DraftTree, choice_paths
from eagle2.drafters.eagle_common import HeadRunner, drafting_settings, path_log_values, to_host, tree_from_drafted


class EagleStaticDrafter(HeadRunner):
    def __init__(self, head, lm_head, device, *, choices: list[list[int]], **drafting):
        super().__init__(head, lm_head, device, **drafting)
        paths = choice_paths(choices)  # parents first, by depth: layer d is a contiguous range of nodes
        index = {p: i for i, p in enumerate(paths)}
        self.paths = paths
        self.parent = torch.tensor([index[p[:-1]] if len(p) > 1 else -1 for p in paths])
        self.rank = torch.tensor([p[-1] for p in paths])
        self.depth = torch.tensor([len(p) for p in paths])
        self.max_rank = int(self.rank.max()) + 1
        parent = self.parent_list = self.parent.tolist()
        is_parent = set(parent)
        self.layers = []  # per depth: (its nodes, the row of each one's parent among the previous depth's
        fed = {-1: 0}     # fed nodes, each one's rank, the positions of those with children)
        for d in range(1, len(paths[-1]) + 1):
            nodes = [i for i, p in enumerate(paths) if len(p) == d]
            parent_rows = [fed[parent[i]] for i in nodes]
            with_children = [j for j, i in enumerate(nodes) if i in is_parent]
            self.layers.append((nodes, torch.tensor(parent_rows), torch.tensor([paths[i][-1] for i in nodes]),
                                with_children))
            fed = {nodes[j]: row for row, j in enumerate(with_children)}

    def propose(self, root: int, room: int) -> DraftTree:
        """Depth by depth: one top-k over the previous depth's fed nodes picks every node's token (the
        rank-th best child of its parent), one head forward feeds the nodes with children; tokens and
        confidences stay on the device until one transfer at the end."""
        logp, feats = self.catch_up()[None], self.root_feature[None]  # the root's children; its feature
        fed_index = {-1: -1}  # node -> its fed index in the head cache
        tokens, log_conf = [], []
        for d, (nodes, parent_rows, ranks, with_children) in enumerate(self.layers, start=1):
            top_tokens, top_conf = self.top(logp, self.max_rank)  # (parents, max_rank)
            rows, cols = parent_rows.to(logp.device), ranks.to(logp.device)
            tokens.append(top_tokens[rows, cols])
            log_conf.append(top_conf[rows, cols])
            if not with_children:
                break
            pick = torch.tensor(with_children, device=logp.device)
            first_fed = self.fed
            parents_fed = [fed_index[self.parent_list[nodes[j]]] for j in with_children]
            logp, feats = self.expand(tokens[-1][pick], parents_fed, d, feats[rows[pick]])
            fed_index.update({nodes[j]: first_fed + row for row, j in enumerate(with_children)})
        tokens, log_conf = to_host(torch.cat(tokens), torch.cat(log_conf))
        n = tokens.shape[0]  # every node up to the deepest layer reached
        parent, depth, rank = self.parent[:n], self.depth[:n], self.rank[:n]
        keep = torch.arange(min(n, max(room - 1, 0)))
        return tree_from_drafted(root, tokens, parent, depth, rank, log_conf, path_log_values(parent, log_conf), keep)


def build(method_cfg, target, params, generator, weights: dict) -> EagleStaticDrafter:
    head = weights["head"]
    return EagleStaticDrafter(head, target.lm_head, target.device, choices=list(method_cfg.choices),
                              **drafting_settings(method_cfg, head))
