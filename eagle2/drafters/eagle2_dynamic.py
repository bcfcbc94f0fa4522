"""EAGLE-2: a dynamic draft tree shaped by the head's own confidence.

Depth 1 is the root's ``top_k`` most likely children. At each further depth the ``top_k`` nodes of
the newest layer with the highest path value V (product of draft confidences from the root, kept
incrementally as a sum of log-probabilities) are expanded with their ``top_k`` most likely children.
Then every drafted node is reranked by V (ties: shallower first) and the best ``total_tokens`` are
kept; since V never grows along a path the kept nodes form a connected tree. With a cost ``profile``
(``total_tokens=auto``) the number kept is chosen per round by ``eagle2.budget.best_budget``: the
count that maximises expected tokens per second, at most ``max_total_tokens``.
"""

from __future__ import annotations

import torch

from eagle2.budget import CostProfile, best_budget
from eagle2.drafters.eagle_common import HeadRunner, drafting_settings, tree_from_drafted
from eagle2.tree import DraftTree


class Eagle2Drafter(HeadRunner):
    def __init__(self, head, lm_head, device, *, depth: int, top_k: int, total_tokens: int,
                 profile: CostProfile | None = None, **drafting):
        """``total_tokens``: nodes verified per round; with a ``profile`` the most it may choose."""
        super().__init__(head, lm_head, device, **drafting)
        if depth < 1 or top_k < 1 or total_tokens < 1:
            raise ValueError("eagle2 needs depth >= 1, top_k >= 1 and total_tokens >= 1")
        self.depth, self.top_k, self.total_tokens, self.profile = depth, top_k, total_tokens, profile

    def propose(self, root: int, room: int) -> DraftTree:
        budget = min(self.total_tokens, room - 1)
        root_logp = self.catch_up()
        if budget < 1:
            return DraftTree.root_only(root)
        k = self.top_k
        top_tokens, top_conf = self.top(root_logp, k)
        # columns of every drafted node, one tensor per layer; drafted index = position in the concatenation
        tokens, parents, ranks = [top_tokens.cpu()], [torch.full((k,), -1)], [torch.arange(k)]
        log_conf, log_value, depth = [top_conf.cpu()], [top_conf.cpu()], [torch.ones(k, dtype=torch.long)]
        start = 0  # drafted index of the newest layer's first node
        parent_fed = torch.full((k,), -1)  # fed index (in the head cache) of each newest-layer node's parent
        parent_feat = self.root_feature.expand(k, -1)
        for d in range(1, self.depth):
            pick = torch.topk(log_value[-1], min(k, log_value[-1].shape[0])).indices.sort().values
            first_fed = len(self.fed_parent)
            logp, feats = self.expand(tokens[-1][pick].tolist(), parent_fed[pick].tolist(), d, parent_feat[pick])
            child_tokens, child_conf = self.top(logp, k)  # (n, k), siblings best-first
            n = pick.shape[0]
            parents.append((pick + start).repeat_interleave(k))
            start += log_value[-1].shape[0]
            tokens.append(child_tokens.reshape(-1).cpu())
            ranks.append(torch.arange(k).repeat(n))
            log_conf.append(child_conf.reshape(-1).cpu())
            log_value.append((log_value[-1][pick, None] + log_conf[-1].view(n, k)).reshape(-1))
            depth.append(torch.full((n * k,), d + 1))
            parent_fed = torch.arange(first_fed, first_fed + n).repeat_interleave(k)
            parent_feat = feats.repeat_interleave(k, dim=0)
        tokens, parents, ranks, log_conf, log_value, depth = (
            torch.cat(c) for c in (tokens, parents, ranks, log_conf, log_value, depth))
        by_depth = torch.argsort(depth, stable=True)
        order = by_depth[torch.argsort(-log_value[by_depth], stable=True)]  # by V, ties shallower first
        meta = {}
        if self.profile is not None:
            budget, expected, seconds = best_budget(log_value[order[:budget]].exp(), self.profile, self.depth)
            meta = {"budget_mode": "auto", "expected_tokens": expected, "predicted_round_s": seconds}
        keep = order[:budget].sort().values
        return tree_from_drafted(root, tokens, parents, depth, ranks, log_conf, log_value, keep, budget=budget,
                                 **meta)


def build(method_cfg, target, params, generator, weights: dict) -> Eagle2Drafter:
    head, drafting = weights["head"], drafting_settings(method_cfg, weights["head"])
    depth, top_k, total, profile = int(method_cfg.depth), int(method_cfg.top_k), method_cfg.total_tokens, None
    if str(total) == "auto":
        from eagle2.cost_profile import get_profile

        total = int(method_cfg.get("max_total_tokens") or 64)
        profile = get_profile(target, head, drafting, depth=depth, top_k=top_k,
                              profile_dir=method_cfg.get("profile_dir"),
                              remeasure=bool(method_cfg.get("reprofile", False)), max_q=total + 1)
    elif not str(total).isdigit():
        raise ValueError(f"method.total_tokens must be a positive integer or auto, not {total!r}")
    return Eagle2Drafter(head, target.lm_head, target.device, depth=depth, top_k=top_k,
                         total_tokens=int(total), profile=profile, **drafting)
