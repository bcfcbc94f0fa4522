"""EAGLE-2: a dynamic draft tree shaped by the head's own confidence.

Depth 1 is the root's ``top_k`` most likely children. At each further depth the ``top_k`` nodes of
the newest layer with the highest path value V (product of draft confidences from the root, kept
incrementally as a sum of log-probabilities) are expanded with their ``top_k`` most likely children.
Then every drafted node is reranked by V (ties: shallower first) and the best ``total_tokens`` are
kept; since V never grows along a path the kept nodes form a connected tree. With a cost ``profile``
(``total_tokens=auto``) the number kept is chosen per round by ``eagle2.drafters.budget.best_budget``: the
count that maximises expected tokens per second, at most ``max_total_tokens``; rows drafting together in a
batch share one count (``best_shared_budget``: their trees are verified padded to the largest). The profile
is data the harness measured and hands over (``weights["cost_profile"]``, ``eagle2.bench.cost_profile``): this
drafter never times a target forward. For batched decoding it is the profile of B rows verified together, ``T_B(q)``.

Adaptive depth (``method.adaptive_depth=true``, with ``total_tokens=auto``): ``depth`` is the most a round drafts,
and each round drafts at the depth the cost model prices best on the rows' last full-depth drafts: for each
d <= ``depth``, the best budget over their nodes of depth <= d (``best_shared_budget``) against the profile's
drafting cost at depth d; the deepest wins only when it pays (ties: shallower). Every ``EXPLORE`` rounds, and
whenever a row has no full-depth draft yet, a round drafts at full depth again. Under batching on a CPU a verify
token costs nearly what a drafting depth does, and depth 1 is often best; at batch 1 the full depth usually is.

Lookup branch (``method.lookup_branch=true``, a hybrid tree): a prompt-lookup chain (``eagle2.drafters.lookup``:
what followed the last n tokens earlier in the prompt or output; or another chain source, as SAMD's,
``eagle2.drafters.samd``) is merged into the tree within the same budget. Its leading tokens that the
head also drafted reuse those nodes (deduplicated, kept whatever their value); the rest hang below as
new nodes; the remaining budget goes to the best other nodes by V. Lookup nodes carry no head
confidence (NaN in the records, ``lookup`` True).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from eagle2.core.tree import DraftTree
from eagle2.drafters import setting_checks as checks
from eagle2.drafters.budget import CostProfile, best_budget, best_shared_budget
from eagle2.drafters.eagle_common import HeadRunner, drafting_settings, to_host, tree_from_drafted
from eagle2.drafters.head_group import TreeHeads
from eagle2.drafters.lookup import find_chains
from eagle2.drafters.policy import resolved_policy

ChainSource = Callable[[list[int]], list[list[int]]]  # the tokens so far -> continuations, best first
EXPLORE = 4  # adaptive depth: every this many rounds, a round drafts at full depth again


class Eagle2Drafter(HeadRunner):
    def __init__(self, head, lm_head, device, *, depth: int, top_k: int, total_tokens: int,
                 profile: CostProfile | None = None, lookup: ChainSource | None = None,
                 adaptive_depth: bool = False, least_budget: int = 1, **drafting):
        """``total_tokens``: nodes verified per round; with a ``profile`` the most it may choose.
        ``lookup``: merge its first chain into each tree (None: the plain EAGLE-2 tree). ``adaptive_depth``:
        each round's drafting depth priced by the profile (the module's docstring), ``depth`` the most.
        ``least_budget``: the fewest nodes an auto budget keeps (0 under ``method.policy=pays``)."""
        super().__init__(head, lm_head, device, **drafting)
        if depth < 1 or top_k < 1 or total_tokens < 1:
            raise ValueError("eagle2 needs depth >= 1, top_k >= 1 and total_tokens >= 1")
        if adaptive_depth and profile is None:
            raise ValueError("method.adaptive_depth=true needs method.total_tokens=auto (a cost profile)")
        self.depth, self.top_k, self.total_tokens, self.profile = depth, top_k, total_tokens, profile
        self.lookup, self.adaptive, self.least_budget = lookup, adaptive_depth, least_budget
        self.full_draft = None  # adaptive: (log V, depth) of this row's last full-depth draft, on the host
        self.since_full = 0  # rounds drafted since it

    def start(self, prompt_ids, first_token, prompt_hidden) -> None:
        super().start(prompt_ids, first_token, prompt_hidden)
        self.sequence = list(prompt_ids) + [first_token]  # what the lookup branch searches

    def observe(self, new_tokens, hidden) -> None:
        super().observe(new_tokens, hidden)
        self.sequence.extend(new_tokens)

    def batch_key(self) -> tuple:
        return (*super().batch_key(), self.depth, self.top_k, self.adaptive)

    def propose(self, root: int, room: int) -> DraftTree:
        return self.propose_batch([self], [root], [room])[0]

    @classmethod
    def propose_batch(cls, drafters: list["Eagle2Drafter"], roots: list[int], rooms: list[int]) -> list[DraftTree]:
        """Every row's tree (drafters of equal ``batch_key``): depth by depth, one head forward and one LM-head
        call for all rows (``eagle2.drafters.head_group``). With a fixed budget each row's tree is the one it
        drafts alone; an auto budget (and an adaptive depth) the rows share."""
        budgets = [min(d.total_tokens, room - 1) for d, room in zip(drafters, rooms)]
        heads = TreeHeads(drafters)
        root_logp, root_feature = heads.catch_up()  # (R, V), (R, H)
        trees = [DraftTree.root_only(root) for root in roots]
        live = [i for i, b in enumerate(budgets) if b >= 1]  # a row with no room left: its root alone
        if not live:
            return trees
        lead, k, rows = drafters[0], drafters[0].top_k, len(drafters)
        reach = cls.round_depth([drafters[i] for i in live])  # the depth this round drafts to
        top_tokens, top_conf = lead.top(root_logp, k)  # (R, k)
        # every drafted node's columns, one entry per layer, a row per tree; drafted index = position in the
        # concatenation. Tokens, scores, parents and the picks stay on the device (no host sync per depth: the
        # shapes are known here, the values move once at the end); ranks and depths are Python lists.
        device = top_tokens.device
        tokens, log_conf, log_value = [top_tokens], [top_conf], [top_conf]
        parents, ranks, depth = [torch.full((rows, k), -1, device=device)], list(range(k)), [1] * k
        start = 0  # drafted index of the newest layer's first node
        parent_fed = torch.full((rows, k), -1, device=device)  # fed index (head cache) of each newest node's parent
        parent_feat = root_feature[:, None].expand(rows, k, root_feature.shape[-1])
        for d in range(1, reach):
            width = log_value[-1].shape[1]
            n = min(k, width)
            pick = torch.topk(log_value[-1], n, dim=-1).indices.sort(dim=-1).values  # (R, n): nodes expanded
            first_fed = heads.fed
            logp, feats = heads.expand(tokens[-1].gather(1, pick), parent_fed.gather(1, pick), d,
                                       parent_feat.gather(1, pick[..., None].expand(-1, -1, parent_feat.shape[-1])))
            child_tokens, child_conf = lead.top(logp, k)  # (R, n, k), siblings best-first
            parents.append((start + pick).repeat_interleave(k, dim=1))
            start += width
            tokens.append(child_tokens.reshape(rows, -1))
            ranks += list(range(k)) * n
            log_conf.append(child_conf.reshape(rows, -1))
            log_value.append((log_value[-1].gather(1, pick)[..., None] + child_conf).reshape(rows, -1))
            depth += [d + 1] * (n * k)
            parent_fed = (first_fed + torch.arange(n, device=device)).repeat_interleave(k).expand(rows, -1)
            parent_feat = feats.repeat_interleave(k, dim=1)
        columns = to_host(*(torch.cat(c, dim=1).reshape(-1) for c in (tokens, log_conf, log_value, parents)))
        columns = [c.reshape(rows, -1) for c in columns]
        ranks, depth = torch.tensor(ranks), torch.tensor(depth)
        shared = cls.shared_budget([drafters[i] for i in live], [columns[2][i] for i in live],
                                   [budgets[i] for i in live], depth, reach)
        for j, i in enumerate(live):
            trees[i] = drafters[i].tree(roots[i], budgets[i], *(c[i] for c in columns), ranks, depth,
                                        shared=None if shared is None else (shared[0], shared[1][j], shared[2]),
                                        reach=reach)
            if drafters[i].adaptive:
                drafters[i].remember(columns[2][i], depth, reach)
        return trees

    @staticmethod
    def round_depth(drafters) -> int:
        """How deep this round drafts: ``depth``, or with ``adaptive_depth`` the depth the profile prices best on
        the rows' last full-depth drafts (a full-depth round when one is due: ``EXPLORE``, or a row has none)."""
        lead = drafters[0]
        if not lead.adaptive or any(d.full_draft is None or d.since_full + 1 >= EXPLORE for d in drafters):
            return lead.depth
        best, best_rate = lead.depth, -1.0
        ranked_drafts = [(lv, dp, ranked(lv, dp)) for lv, dp in (d.full_draft for d in drafters)]
        for reach in range(1, lead.depth + 1):
            values = [lv[order[dp[order] <= reach]][: lead.total_tokens].exp() for lv, dp, order in ranked_drafts]
            _, expected, seconds = best_shared_budget(values, lead.profile, reach, lead.least_budget)
            if sum(expected) / seconds > best_rate * (1 + 1e-9):
                best, best_rate = reach, sum(expected) / seconds
        return best

    def remember(self, log_value: torch.Tensor, depth: torch.Tensor, reach: int) -> None:
        """Adaptive depth: keep a full-depth round's drafted values, count the rounds since."""
        if reach == self.depth:
            self.full_draft, self.since_full = (log_value, depth), 0
        else:
            self.since_full += 1

    @staticmethod
    def shared_budget(drafters, log_values, budgets, depth, reach: int) -> tuple[int, list[float], float] | None:
        """Rows drafting together with an auto budget (and no lookup branch) share one: ``best_shared_budget``
        over each row's best ``budgets[b]`` path values, drafted to depth ``reach``. None: each row prices its
        own tree."""
        if len(drafters) < 2 or any(d.profile is None or d.lookup is not None for d in drafters):
            return None
        values = [lv[ranked(lv, depth)[:b]].exp() for lv, b in zip(log_values, budgets)]
        return best_shared_budget(values, drafters[0].profile, reach, drafters[0].least_budget)

    def tree(self, root: int, budget: int, tokens, log_conf, log_value, parents, ranks, depth,
             shared: tuple[int, float, float] | None = None, reach: int | None = None) -> DraftTree:
        """This row's tree from its drafted columns (on the host): the best ``budget`` nodes by V (or the
        budget the cost profile picks; ``shared``: the budget of the rows drafting together, this row's expected
        tokens and the round's predicted seconds; ``reach``: the depth drafted, ``depth`` unless adaptive), with the
        lookup chain merged in when there is one."""
        order, reach = ranked(log_value, depth), reach or self.depth
        meta = {"draft_depth": reach} if self.adaptive else {}
        if shared is not None:
            budget = min(budget, shared[0])
            meta.update(budget_mode="auto", expected_tokens=shared[1], predicted_round_s=shared[2],
                        budget_shared=True)
        elif self.profile is not None:
            budget, expected, seconds = best_budget(log_value[order[:budget]].exp(), self.profile, reach,
                                                   self.least_budget)
            meta.update(budget_mode="auto", expected_tokens=expected, predicted_round_s=seconds)
        keep = order[:budget].sort().values
        if self.lookup is not None:
            drafted, chains = tokens.shape[0], self.lookup(self.sequence)
            columns, keep = merge_chain(chains[0] if chains else [], (tokens, parents, depth, ranks, log_conf,
                                                                     log_value), order, budget)
            tokens, parents, depth, ranks, log_conf, log_value = columns
            meta["lookup_nodes"] = tokens.shape[0] - drafted
        tree = tree_from_drafted(root, tokens, parents, depth, ranks, log_conf, log_value, keep, budget=budget,
                                 **meta)
        if self.lookup is not None:
            tree.records["lookup"] = [i >= drafted for i in range(tokens.shape[0])]
        return tree


def ranked(log_value: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    """Drafted nodes' indices by path value V, best first (ties: shallower first)."""
    by_depth = torch.argsort(depth, stable=True)
    return by_depth[torch.argsort(-log_value[by_depth], stable=True)]


def merge_chain(chain: list[int], columns: tuple, order: torch.Tensor, budget: int):
    """Merge a lookup chain into drafted nodes: ``columns`` = (tokens, parents, depth, ranks, log_conf,
    log_value) of every drafted node (parents as drafted indices, -1 the root), ``order`` their ranking.
    The chain's leading tokens that match drafted nodes (same parent, same token) reuse them; the rest
    are appended as new nodes (rank -1, NaN confidence and value). Returns (the extended columns, the
    kept drafted indices, ascending): the chain's nodes, then the best others by ``order``, ``budget``
    in all; closed under parents since V never grows along a path."""
    tokens, parents, depth, ranks, log_conf, log_value = columns
    n = tokens.shape[0]
    where = {(p, t): i for i, (p, t) in enumerate(zip(parents.tolist(), tokens.tolist()))}
    forced, new_tokens, new_parents, new_depth = [], [], [], []

    def depth_of(node: int) -> int:  # -1 the root, < n a drafted node, else a new one
        return 0 if node < 0 else int(depth[node]) if node < n else new_depth[node - n]

    parent = -1
    for token in chain[:budget]:
        if not new_tokens and (parent, token) in where:  # the head drafted it too: reuse that node
            parent = where[parent, token]
            forced.append(parent)
            continue
        new_tokens.append(token)
        new_parents.append(parent)
        new_depth.append(depth_of(parent) + 1)
        parent = n + len(new_tokens) - 1
    taken = set(forced)
    rest = [i for i in order.tolist() if i not in taken][: budget - len(forced) - len(new_tokens)]
    keep = torch.tensor(sorted(forced + rest) + list(range(n, n + len(new_tokens))), dtype=torch.long)
    m, nan = len(new_tokens), torch.full((len(new_tokens),), float("nan"))
    columns = (torch.cat([tokens, torch.tensor(new_tokens, dtype=tokens.dtype)]),
               torch.cat([parents, torch.tensor(new_parents, dtype=parents.dtype)]),
               torch.cat([depth, torch.tensor(new_depth, dtype=depth.dtype)]),
               torch.cat([ranks, torch.full((m,), -1, dtype=ranks.dtype)]),
               torch.cat([log_conf, nan]), torch.cat([log_value, nan]))
    return columns, keep


CHECKS = {"adaptive_depth": checks.only_with("total_tokens", "auto"), "lookup_branch": checks.boolean(),
          "reprofile": checks.boolean(), "profile_dir": checks.path("~/.cache/eagle2/profiles")}
# run before any model loads (eagle2.bench.validation); its integer keys are checked there by meaning


def build(method_cfg, target, params, generator, weights: dict) -> Eagle2Drafter:
    head, drafting = weights["head"], drafting_settings(method_cfg, weights["head"])
    depth, top_k, total, profile = int(method_cfg.depth), int(method_cfg.top_k), method_cfg.total_tokens, None
    if str(total) == "auto":
        total, profile = int(method_cfg.get("max_total_tokens") or 64), weights.get("cost_profile")
        if profile is None:
            raise ValueError("method.total_tokens=auto needs the cost profile the harness measures "
                             "(eagle2.bench.methods.build_drafter hands it over as weights['cost_profile'])")
    elif not str(total).isdigit():
        raise ValueError(f"method.total_tokens must be a positive integer or auto, not {total!r}")
    lookup = None
    if method_cfg.get("lookup_branch"):
        from eagle2.drafters.pld import lookup_settings

        lookup = partial(find_chains, settings=lookup_settings(method_cfg, prefix="lookup_", default_k=depth))
    pays = resolved_policy(method_cfg, profile is not None) == "pays"
    return Eagle2Drafter(head, target.lm_head, target.device, depth=depth, top_k=top_k,
                         total_tokens=int(total), profile=profile, lookup=lookup,
                         adaptive_depth=bool(method_cfg.get("adaptive_depth", False)),
                         least_budget=0 if pays else 1, **drafting)
