"""Token Recycling (Luo et al., 2024): no draft model, no training; an adjacency matrix holds, for every
token, the target's top-k next tokens the last time the target read that token, and a static tree
template is filled from it breadth-first.

The matrix (V, k) lives on the target's device. After every verify (``observe_target``) the row of each
tree node's token becomes the target's top-k at that node: accepted, rejected and bonus positions alike
("recycled" candidates). Drafting: the template's path [i] is the root's i-th successor, path [i, j] that
node's j-th successor, and so on, depth by depth on the device, one transfer at the end; a node whose
parent's row has never been written is left out with its subtree. Defaults are the authors': k = 8 and
their 80-node, 6-level template ("2.2.2").

The authors keep one matrix across requests; a drafter here lives for one request, so its matrix starts
from the request's prompt: the target's top-k at every prompt position (its prefill outputs, read through
the LM head once, at the first proposal, timed as drafting). A node's confidence is the target's
probability of its token (temperature 1) when its parent's row was written; path values multiply them.

Drafts are chosen deterministically (no ``q_draft``): lossless at any temperature under the shared rule
for deterministically chosen children.
"""

from __future__ import annotations

import torch

from eagle2.core.tree import DraftTree, choice_paths
from eagle2.drafters import setting_checks as checks
from eagle2.drafters.eagle_common import path_log_values, to_host, tree_from_drafted


class TokenRecyclingDrafter:
    needs_hidden = True  # the prompt's features seed the matrix (observe ignores its features)
    forward_time = 0.0  # no model forwards of its own (the seeding's LM head is timed as drafting)

    def __init__(self, lm_head, vocab_size: int, device, choices, top_k: int = 8):
        paths = choice_paths(choices)
        if max(max(p) for p in paths) >= top_k:
            raise ValueError(f"method.choices use ranks up to {max(max(p) for p in paths)}, beyond top_k={top_k}")
        index = {p: i for i, p in enumerate(paths)}
        self.parent = torch.tensor([index[p[:-1]] if len(p) > 1 else -1 for p in paths])
        self.rank = torch.tensor([p[-1] for p in paths])
        self.depth = torch.tensor([len(p) for p in paths])
        depths = self.depth.tolist()
        self.layers = [(depths.index(d), len(depths) - depths[::-1].index(d)) for d in sorted(set(depths))]
        self.lm_head, self.vocab_size, self.device, self.top_k = lm_head, vocab_size, device, top_k
        self.template_on_device = (self.parent.to(device), self.rank.to(device))

    def start(self, prompt_ids, first_token, prompt_hidden) -> None:
        self.successors = torch.zeros(self.vocab_size, self.top_k, dtype=torch.long, device=self.device)
        self.log_conf = torch.zeros(self.vocab_size, self.top_k, device=self.device)
        self.known = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
        self.unseeded = (list(prompt_ids), prompt_hidden)

    def _recycle(self, tokens: torch.Tensor, logits: torch.Tensor) -> None:
        """Rows ``tokens`` (N,) of the matrix become the top-k of ``logits`` (N, V), the last occurrence's for a
        token that occurs twice."""
        rows, order = tokens.to(self.device), torch.arange(len(tokens), device=self.device)
        last = torch.zeros(self.vocab_size, dtype=torch.long, device=self.device)
        last.scatter_reduce_(0, rows, order, "amax", include_self=False)
        pick = last[rows] == order  # a repeated token's last position wins (repeated writes are unordered on GPUs)
        top = logits[pick].float().log_softmax(-1).topk(self.top_k, dim=-1)
        self.successors[rows[pick]] = top.indices
        self.log_conf[rows[pick]] = top.values
        self.known[rows[pick]] = True

    def observe_target(self, tree: DraftTree, target_logits: torch.Tensor) -> None:
        self._recycle(tree.tokens, target_logits)

    def observe(self, new_tokens, hidden) -> None:
        pass

    def propose(self, root: int, room: int) -> DraftTree:
        if self.unseeded is not None:  # the prompt's prefill outputs: the matrix's first rows
            prompt_ids, hidden = self.unseeded
            self._recycle(torch.tensor(prompt_ids), self.lm_head(hidden.to(self.device)))
            self.unseeded = None
        n = len(self.parent)
        tokens = torch.empty(n, dtype=torch.long, device=self.device)
        log_conf = torch.empty(n, device=self.device)
        valid = torch.empty(n, dtype=torch.bool, device=self.device)
        parent, rank = self.template_on_device
        for first, end in self.layers:  # depth by depth: parents are filled before their children
            if first == 0:
                parent_tokens = torch.full((end,), root, device=self.device)
                parent_valid = torch.ones(end, dtype=torch.bool, device=self.device)
            else:
                parent_tokens, parent_valid = tokens[parent[first:end]], valid[parent[first:end]]
            tokens[first:end] = self.successors[parent_tokens, rank[first:end]]
            log_conf[first:end] = self.log_conf[parent_tokens, rank[first:end]]
            valid[first:end] = parent_valid & self.known[parent_tokens]
        tokens, log_conf, valid = to_host(tokens, log_conf, valid)
        drafted = valid.nonzero().flatten()  # parents first: a valid node's parent is valid
        renumber = torch.full((n + 1,), -1, dtype=torch.long)
        renumber[drafted] = torch.arange(len(drafted))
        parents = torch.where(self.parent[drafted] < 0, -1, renumber[self.parent[drafted]])
        keep = torch.arange(min(len(drafted), max(room - 1, 0)))
        return tree_from_drafted(root, tokens[drafted], parents, self.depth[drafted], self.rank[drafted],
                                 log_conf[drafted], path_log_values(parents, log_conf[drafted]), keep)


def _above_every_rank(top_k, cfg) -> bool:
    """``top_k`` an integer beyond every rank of ``method.choices`` (a malformed tree: the generic check's)."""
    try:
        ranks = max(max(p) for p in choice_paths(list(cfg.get("choices") or [[0]])))
    except (TypeError, ValueError):
        ranks = 0
    return isinstance(top_k, int) and not isinstance(top_k, bool) and top_k > ranks


CHECKS = {"top_k": checks.Check("an integer above every rank in method.choices", _above_every_rank)}


def build(method_cfg, target, params, generator, weights: dict) -> TokenRecyclingDrafter:
    return TokenRecyclingDrafter(target.lm_head, int(target.config.vocab_size), target.device,
                                 [list(c) for c in method_cfg.choices], top_k=int(method_cfg.get("top_k", 8)))
