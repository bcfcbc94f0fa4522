"""SuffixDecoding (Oliaro et al., 2024): no draft model; two suffix trees (``eagle2.drafters.suffix_tree``),
one over this request's prompt and output and one global over the outputs of the run's requests, are
searched for the longest suffix of the context, and from the match the most likely continuations are
grown best first by frequency. The speculation grows with the match: at most ``alpha`` x (matched
length) nodes (the paper's MAX_SPEC = alpha * p), at most ``max_spec`` and the round's room, each with path
probability >= ``min_prob``; of the two trees' proposals the one with the higher score (the sum of path
probabilities) is drafted. Defaults as the authors' implementation: depth 24, alpha 1, min_prob 0.1.

The global tree lives in the run's state (``weights["run_state"]``, one per run; the warm-up's is
dropped) and takes each output as it is generated, so requests decoded together in a batch see each
other's outputs; without a run state (tests, a drafter built alone) it holds this request's output only.
Nodes are chosen deterministically: lossless at any temperature by the rule for deterministically
chosen siblings (``eagle2.core.accept``).
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle2.core.tree import DraftTree
from eagle2.drafters import setting_checks as checks
from eagle2.drafters.counted_trie import tree_from_counts
from eagle2.drafters.suffix_tree import SuffixTree


@dataclass(frozen=True)
class SuffixSettings:
    max_depth: int = 24  # longest window kept in the trees: pattern + speculation
    alpha: float = 1.0  # speculated nodes per matched token
    max_spec: int = 32
    min_prob: float = 0.1
    global_tree: bool = True  # false: the per-request tree only

    def __post_init__(self):
        if self.max_depth < 2 or self.alpha <= 0 or self.max_spec < 1 or not 0 <= self.min_prob <= 1:
            raise ValueError("SuffixDecoding needs max_depth >= 2, alpha > 0, max_spec >= 1, 0 <= min_prob <= 1")


class SuffixDrafter:
    needs_hidden = False
    forward_time = 0.0  # no model forwards

    def __init__(self, settings: SuffixSettings, global_tree: SuffixTree | None):
        self.settings, self.global_tree = settings, global_tree

    def start(self, prompt_ids, first_token, prompt_hidden) -> None:
        self.sequence = list(prompt_ids) + [first_token]
        self.local = SuffixTree(self.settings.max_depth)
        self.local_cursor = self.local.extend([], self.sequence)
        self.global_cursor = self._to_global([], [first_token])

    def _to_global(self, cursor: list[int], tokens: list[int]) -> list[int]:
        return self.global_tree.extend(cursor, tokens) if self.global_tree is not None else cursor

    def observe(self, new_tokens, hidden) -> None:
        self.sequence.extend(new_tokens)
        self.local_cursor = self.local.extend(self.local_cursor, new_tokens)
        self.global_cursor = self._to_global(self.global_cursor, list(new_tokens))

    def propose(self, root: int, room: int) -> DraftTree:
        s, best = self.settings, None
        for source, tree in (("request", self.local), ("global", self.global_tree)):
            if tree is None:
                continue
            node, length = tree.match(self.sequence)
            if not length:
                continue
            budget = min(int(s.alpha * length), s.max_spec, room - 1)
            paths, counts, score = tree.speculate(node, budget, s.min_prob)
            if paths and (best is None or score > best[0]):
                best = (score, source, length, paths, counts, tree.count[node])
        if best is None:
            return DraftTree.root_only(root)
        score, source, length, paths, counts, node_count = best
        return tree_from_counts(root, paths, counts, node_count, suffix_tree=source, matched_length=length,
                                score=round(score, 4))


CHECKS = {"max_depth": checks.integer(2), "alpha": checks.number(0, above=True), "max_spec": checks.integer(1),
          "min_prob": checks.number(0, 1), "global_tree": checks.boolean()}  # before any model loads


def build(method_cfg, target, params, generator, weights: dict) -> SuffixDrafter:
    defaults = SuffixSettings()

    def get(key, cast):
        value = method_cfg.get(key)
        return getattr(defaults, key) if value is None else cast(value)

    settings = SuffixSettings(max_depth=get("max_depth", int), alpha=get("alpha", float), max_spec=get("max_spec", int),
                              min_prob=get("min_prob", float), global_tree=get("global_tree", bool))
    shared = None
    if settings.global_tree:  # one per run and depth; alone (no run state): this request's output only
        state = {} if weights.get("run_state") is None else weights["run_state"]
        shared = state.setdefault(f"suffix_global_{settings.max_depth}", SuffixTree(settings.max_depth))
    return SuffixDrafter(settings, shared)
