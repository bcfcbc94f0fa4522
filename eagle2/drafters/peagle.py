"""P-EAGLE: K depths drafted by ONE head forward per round (``eagle2.heads.peagle_head``).

Each round the head catches up on the newly committed (token, fused feature) pairs and, in the same forward,
runs K - 1 mask slots behind the last of them (K = ``depth``): the output at the last pair gives depth 1's
distribution, slot d depth d + 1's. The slots' cache entries are dropped at the next catch-up. The round's tree
is a choice tree over these K distributions (Medusa's notation, ``eagle2.drafters.medusa``): node
``[r1, ..., rd]`` is the rd-th most likely token of depth d. ``choice_tree`` names it; null gives the chain of the
depths' best tokens with each depth's ``top_k`` - 1 runners-up as siblings (``top_k=1``: a chain). The tree keeps
the best ``total_tokens`` nodes by path value V (the product of confidences), or with ``total_tokens=auto`` the
count the cost profile prices best (``eagle2.drafters.budget``), as EAGLE-2 does. The choices are deterministic
(top-k), so at temperature > 0 they are verified by the rule for deterministically chosen siblings. Every
drafted node is recorded with its depth, rank and confidence. Rows of a batch draft together
(``propose_batch``): ONE head forward a round catches every row up and runs every row's slots, each row at its own
positions (``batch_log_probs``, ``eagle2.drafters.head_group``), then one drafting LM-head call for all of them
(DFlash and PARD are this drafter but for the forward).
"""

from __future__ import annotations

import torch

from eagle2.core.cache import crop
from eagle2.core.tree import DraftTree, choice_paths
from eagle2.drafters import setting_checks as checks
from eagle2.drafters.budget import CostProfile, best_budget
from eagle2.drafters.eagle2_dynamic import ranked
from eagle2.drafters.eagle_common import HeadRunner, path_log_values, to_host, tree_from_drafted
from eagle2.drafters.head_group import BACKLOG, TreeHeads, shared_span
from eagle2.heads.eagle_head import causal_mask
from eagle2.heads.static_head import forward_head


def default_choices(depth: int, top_k: int) -> list[list[int]]:
    """The best chain of ``depth`` tokens, each depth's ``top_k`` - 1 runners-up as siblings."""
    return [[0] * d + [r] for d in range(depth) for r in range(top_k)]


class PEagleDrafter(HeadRunner):
    def __init__(self, head, device, *, depth: int, choices, total_tokens: int, profile: CostProfile | None = None):
        super().__init__(head, None, device)
        self.depth = depth
        self.paths = [p for p in choice_paths(choices) if len(p) <= depth]
        index = {p: i for i, p in enumerate(self.paths)}
        self.parent = torch.tensor([index[p[:-1]] if len(p) > 1 else -1 for p in self.paths])
        self.node_depth = torch.tensor([len(p) for p in self.paths])
        self.rank = torch.tensor([p[-1] for p in self.paths])
        self.top_k = int(self.rank.max()) + 1
        self.total_tokens, self.profile = total_tokens, profile

    def parallel_log_probs(self) -> torch.Tensor:
        """Catch up on the pending pairs and run the K - 1 mask slots behind them, in ONE head forward; returns
        (K, V) log-probabilities of depths 1..K over the drafting vocabulary."""
        n = len(self.pending_tokens)
        pending = torch.cat([f.to(self.device, self.dtype) for f in self.pending_feats])  # (n, F)
        tokens, feats = self.with_slots(torch.tensor(self.pending_tokens, device=self.device), pending)
        crop(self.cache, self.committed)  # the last round's slots
        q = tokens.shape[0]  # n + K - 1
        positions = torch.arange(self.committed, self.committed + q, device=self.device)
        out = self._head(tokens, feats, positions, causal_mask(q, self.committed, self.dtype, self.device))
        self.caught_up(n, out[n - 1])  # the slots' entries lie past the committed ones: dropped next round
        return self.log_probs(out[n - 1:])

    def with_slots(self, tokens: torch.Tensor, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's inputs ``tokens`` (..., n), ``feats`` (..., n, F) with the K - 1 mask slots behind them:
        (..., n + K - 1), (..., n + K - 1, F)."""
        slots = self.depth - 1
        mask_tokens, mask_feats = self.head.mask_slots(slots, self.device)  # (K - 1,), (K - 1, F)
        rows = tokens.shape[:-1]
        return (torch.cat([tokens, mask_tokens.expand(*rows, slots)], dim=-1),
                torch.cat([feats, mask_feats.to(feats.dtype).expand(*rows, slots, -1)], dim=-2))

    def ready(self) -> None:
        """Before a round drafted with other rows: the row has something pending to feed (PARD re-feeds its last
        token when nothing new was committed; a head's row always has its last pair)."""

    def propose(self, root: int, room: int) -> DraftTree:
        return self.tree_of(root, room, self.parallel_log_probs())

    @classmethod
    def propose_batch(cls, drafters: list["PEagleDrafter"], roots: list[int], rooms: list[int]) -> list[DraftTree]:
        """Every row's tree (drafters of equal ``batch_key``): the rows' K depths drafted together
        (``batch_log_probs``), then each row's tree is the one it drafts alone (``tree_of``). A head compiled for
        one row (or for the batch) drafts row by row."""
        lead = drafters[0]
        if len(drafters) == 1 or getattr(lead.head, "static_decoder", None) is not None \
                or getattr(lead.head, "static_batch", None) is not None:
            return [d.propose(root, room) for d, root, room in zip(drafters, roots, rooms)]
        log_probs = cls.drafted_together(drafters)
        return [d.tree_of(root, room, lp) for d, root, room, lp in zip(drafters, roots, rooms, log_probs)]

    @classmethod
    def drafted_together(cls, drafters: list["PEagleDrafter"]) -> torch.Tensor:
        """(R, K, V): every row's ``parallel_log_probs``, the rows drafting together (``batch_log_probs``)."""
        for d in drafters:
            d.ready()
        # a round commits at most its K drafted tokens and the bonus: only a fresh prompt is fed alone first
        return cls.batch_log_probs(drafters, TreeHeads(drafters, backlog=max(BACKLOG, drafters[0].depth + 1)))

    @classmethod
    def batch_log_probs(cls, drafters: list["PEagleDrafter"], heads: TreeHeads) -> torch.Tensor:
        """(R, K, V): every row's ``parallel_log_probs``, drafted together over ``heads``: ONE head forward catches
        every row up and runs the K - 1 mask slots behind each row's own pairs (``TreeHeads.feed_block``: the output
        at a row's last pair is depth 1, its slots depths 2..K), then one drafting LM-head call."""
        lead = drafters[0]
        tokens, feats = lead.with_slots(*heads.pending_inputs())  # (R, span + K - 1), (R, span + K - 1, F)
        out = heads.feed_block(lambda positions, mask, cache: forward_head(lead.head, tokens, feats, positions, mask,
                                                                           cache), lead.depth - 1)  # (R, K, H)
        return lead.shared_log_probs(drafters, out)

    def shared_log_probs(self, drafters: list["PEagleDrafter"], out: torch.Tensor) -> torch.Tensor:
        """ONE drafting LM-head call over every row's outputs ``out`` (R, n, H), timed in every row's spans:
        (R, n, V)."""
        with shared_span(drafters):
            return self.log_probs_unspanned(out.reshape(-1, out.shape[-1])).reshape(*out.shape[:2], -1)

    def batch_key(self) -> tuple:
        return (*super().batch_key(), self.depth)  # the slots; each row builds its own tree (tree_of)

    def tree_of(self, root: int, room: int, log_probs: torch.Tensor) -> DraftTree:
        """The round's tree from the K depths' log-probabilities (K, V) (see the module's docstring)."""
        budget = min(self.total_tokens, len(self.paths), room - 1)
        if budget < 1:
            return DraftTree.root_only(root)
        tokens, log_conf = self.top(log_probs, self.top_k)  # (K, top_k), best first
        pick = (self.node_depth - 1).to(tokens.device), self.rank.to(tokens.device)
        tokens, log_conf = to_host(tokens[pick], log_conf[pick])
        log_value = path_log_values(self.parent, log_conf)
        order, meta = ranked(log_value, self.node_depth), {}
        if self.profile is not None:
            budget, expected, seconds = best_budget(log_value[order[:budget]].exp(), self.profile, self.depth)
            meta = {"budget_mode": "auto", "expected_tokens": expected, "predicted_round_s": seconds}
        return tree_from_drafted(root, tokens, self.parent, self.node_depth, self.rank, log_conf, log_value,
                                 order[:budget].sort().values, budget=budget, **meta)


def tree_settings(method_cfg, weights: dict, depth: int) -> dict:
    """The choice tree and budget of a one-forward drafter drafting ``depth`` deep (P-EAGLE, DFlash, PARD):
    ``choice_tree`` or the best chain with ``top_k`` per depth, and ``total_tokens`` (``auto``: the harness's
    cost profile prices each round, up to ``max_total_tokens``)."""
    choices = method_cfg.get("choice_tree") or default_choices(depth, int(method_cfg.top_k))
    total, profile = method_cfg.total_tokens, None
    if str(total) == "auto":
        total, profile = int(method_cfg.get("max_total_tokens") or 64), weights.get("cost_profile")
        if profile is None:
            raise ValueError("method.total_tokens=auto needs the cost profile the harness measures")
    return {"depth": depth, "choices": [list(c) for c in choices], "total_tokens": int(total), "profile": profile}


def build(method_cfg, target, params, generator, weights: dict) -> PEagleDrafter:
    return PEagleDrafter(weights["peagle_head"], target.device,
                         **tree_settings(method_cfg, weights, int(method_cfg.depth)))


def _choice_tree(value, _cfg) -> bool:
    try:
        return value is None or bool(choice_paths(list(value)))
    except (TypeError, ValueError):
        return False


CHECKS = {"depth": checks.integer(1), "top_k": checks.integer(1), "total_tokens": checks.integer_or("auto", 1),
          "choice_tree": checks.Check("null (the best chain with top_k per depth) or choice paths ([[0], [1], [0, 0]])",
                                      _choice_tree),
          "reprofile": checks.boolean(), "profile_dir": checks.path("~/.cache/eagle2/profiles")}
