"""EAGLE (static tree): a fixed tree shape given as choice paths.

Path [i, j] is the j-th most likely child of the node reached by path [i]. The head runs depth by
depth, feeding only the nodes that have children in the shape.
"""

from __future__ import annotations

import torch

from eagle2.core.tree import DraftTree, choice_paths
from eagle2.drafters.eagle_common import HeadRunner, drafting_settings, path_log_values, to_host, tree_from_drafted
from eagle2.drafters.head_group import TreeHeads


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

    def batch_key(self) -> tuple:
        return (*super().batch_key(), tuple(map(tuple, self.paths)))

    def propose(self, root: int, room: int) -> DraftTree:
        return self.propose_batch([self], [root], [room])[0]

    @classmethod
    def propose_batch(cls, drafters: list["EagleStaticDrafter"], roots: list[int], rooms: list[int]) -> list[DraftTree]:
        """Depth by depth, for every row at once (drafters of equal ``batch_key``: one shape): one top-k over
        the previous depth's fed nodes picks every node's token (the rank-th best child of its parent), one head
        forward feeds the nodes with children (``eagle2.drafters.head_group``); tokens and confidences stay on
        the device until one transfer at the end. Each row's tree is the one it drafts alone."""
        lead, rows = drafters[0], len(drafters)
        heads = TreeHeads(drafters)
        logp, feats = heads.catch_up()  # the roots' children (R, V); their features (R, H)
        logp, feats = logp[:, None], feats[:, None]  # (R, parents, ...)
        fed_index = {-1: -1}  # node -> its fed index in the head cache (the same in every row)
        tokens, log_conf = [], []
        for d, (nodes, parent_rows, ranks, with_children) in enumerate(lead.layers, start=1):
            top_tokens, top_conf = lead.top(logp, lead.max_rank)  # (R, parents, max_rank)
            at, cols = parent_rows.to(logp.device), ranks.to(logp.device)
            tokens.append(top_tokens[:, at, cols])
            log_conf.append(top_conf[:, at, cols])
            if not with_children:
                break
            pick = torch.tensor(with_children, device=logp.device)
            first_fed = heads.fed
            parents_fed = [fed_index[lead.parent_list[nodes[j]]] for j in with_children]
            logp, feats = heads.expand(tokens[-1][:, pick], parents_fed, d, feats[:, at[pick]])
            fed_index.update({nodes[j]: first_fed + row for row, j in enumerate(with_children)})
        tokens, log_conf = (c.reshape(rows, -1) for c in to_host(torch.cat(tokens, dim=1).reshape(-1),
                                                                  torch.cat(log_conf, dim=1).reshape(-1)))
        n = tokens.shape[1]  # every node up to the deepest layer reached
        parent, depth, rank = lead.parent[:n], lead.depth[:n], lead.rank[:n]
        trees = []
        for b, (root, room) in enumerate(zip(roots, rooms)):
            keep = torch.arange(min(n, max(room - 1, 0)))
            trees.append(tree_from_drafted(root, tokens[b], parent, depth, rank, log_conf[b],
                                           path_log_values(parent, log_conf[b]), keep))
        return trees


def build(method_cfg, target, params, generator, weights: dict) -> EagleStaticDrafter:
    head = weights["head"]
    return EagleStaticDrafter(head, target.lm_head, target.device, choices=list(method_cfg.choices),
                              **drafting_settings(method_cfg, head))
