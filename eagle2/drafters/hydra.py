"""Hydra: sequentially dependent heads (``eagle2.heads.hydra_heads``) draft the tree of ranked choices
depth by depth.

The tree is Medusa's notation (``method.choices``: node ``[r1, ..., rd]``, siblings best-first) read
Hydra's way: a node's children are the top choices of head d given the hidden state of the last committed
token AND the node's own path (the root, then the drafted tokens down to the node), so two nodes at the
same depth get different children. Each depth is one batched head forward over the nodes that have
children there (the authors' ``_grounded_proposal`` expands the tree the same way). Candidates are chosen
deterministically (top-k), so at temperature > 0 they go through the rule for deterministically chosen
children (``eagle2.core.accept``), as Medusa's; per-node confidences are the head's probabilities.
"""

from __future__ import annotations

import torch

from eagle2.drafters.medusa import ChoiceTreeDrafter
from eagle2.heads.compiled_stack import blocks
from eagle2.heads.hydra_heads import HydraHeads


class HydraDrafter(ChoiceTreeDrafter):
    def __init__(self, heads: HydraHeads, device, *, choices, lm_head_dtype: torch.dtype | None = None):
        super().__init__(heads, device, choices=choices, lm_head_dtype=lm_head_dtype)
        index = {p: i for i, p in enumerate(self.paths)}
        self.levels = []  # per depth d: (the nodes, their parents' rows among the expanded, the expanded, top-k)
        for d in range(1, self.num_heads + 1):
            nodes = [i for i, p in enumerate(self.paths) if len(p) == d]
            expanded = sorted({index.get(self.paths[i][:-1], -1) for i in nodes})  # -1: the root
            row = {p: r for r, p in enumerate(expanded)}
            parent_rows = torch.tensor([row[index.get(self.paths[i][:-1], -1)] for i in nodes])
            top_k = 1 + max(self.paths[i][-1] for i in nodes)
            self.levels.append((torch.tensor(nodes), parent_rows, expanded, top_k))

    def node_candidates(self, root: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.paths)
        node_path: list[list[int]] = [[] for _ in range(n)]  # the drafted tokens root -> node
        tokens, log_conf = torch.zeros(n, dtype=torch.long), torch.zeros(n)
        param = next(self.heads.parameters())
        with self.spans.span():
            hidden = self.hidden.to(param.device, param.dtype)
            for d, (nodes, parent_rows, expanded, top_k) in enumerate(self.levels):
                paths = torch.tensor([[root] + (node_path[p] if p >= 0 else []) for p in expanded],
                                     device=param.device)  # (P, d+1): the root, then the path's drafted tokens
                feats = blocks(self.heads).head_features(d, hidden.expand(len(expanded), -1), paths)  # (P, H)
                lm = self.lm_heads[d]
                top = torch.topk(torch.log_softmax(lm(feats.to(lm.weight.dtype)).float(), -1), top_k, dim=-1)
                ids, lp = top.indices.cpu(), top.values.cpu()
                ids = ids if self.vocab is None else self.vocab[ids]
                ranks = self.rank[nodes]
                tokens[nodes], log_conf[nodes] = ids[parent_rows, ranks], lp[parent_rows, ranks]
                for i, r, k in zip(nodes.tolist(), parent_rows.tolist(), ranks.tolist()):
                    parent = expanded[r]
                    node_path[i] = (node_path[parent] if parent >= 0 else []) + [int(ids[r, k])]
        return tokens, log_conf


def build(method_cfg, target, params, generator, weights: dict) -> HydraDrafter:
    from eagle2.core.precision import resolve_dtype

    dtype = method_cfg.get("draft_lm_head_dtype")
    return HydraDrafter(weights["hydra_head"], target.device, choices=list(method_cfg.choices),
                        lm_head_dtype=resolve_dtype(dtype) if dtype else None)
