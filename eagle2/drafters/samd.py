"""SAMD, SAM decoding (Hu et al., 2024), as the parts that exist: retrieval by the longest suffix match
in this request's context and in a corpus, with EAGLE-2 as the model drafter beside it.

The paper matches the context's suffix in two suffix automata (the request's tokens and a static
corpus) and drafts the retrieved continuation, falling back to an auxiliary drafter (EAGLE-2 in its
strongest configuration). Here the retrieved chain is merged into each EAGLE-2 tree within the same
budget (the hybrid tree of ``eagle2.drafters.eagle2_dynamic``'s lookup branch), so where retrieval
finds nothing the tree is EAGLE-2's alone, and where it does the head's tree still fills the rest of the
budget. The chain: of the two matches, the longer (the context's on a tie), followed by the most
frequent next token at each step, ``lookup_k`` tokens (null: ``depth``). The context is a counted suffix
tree (``eagle2.drafters.suffix_tree``, windows of ``max_depth``), the corpus the REST datastore
(``eagle2.heads.rest_datastore``: spans ``max_span``..``min_span``, ``max_matches`` occurrences).
"""

from __future__ import annotations

from eagle2.drafters import setting_checks as checks
from eagle2.drafters.eagle2_dynamic import CHECKS as EAGLE2_CHECKS
from eagle2.drafters.eagle2_dynamic import Eagle2Drafter
from eagle2.drafters.eagle2_dynamic import build as build_eagle2
from eagle2.drafters.suffix_tree import SuffixTree
from eagle2.heads.rest_datastore import Datastore, top_prefixes


class RetrievedChain:
    """A chain source for the hybrid tree: the sequence so far -> [the retrieved chain] or []."""

    def __init__(self, datastore: Datastore, k: int, *, max_depth: int = 24, max_span: int = 16, min_span: int = 2,
                 max_matches: int = 5000):
        self.datastore, self.k, self.spans = datastore, k, (max_span, min_span, max_matches)
        self.context, self.cursor, self.seen = SuffixTree(max_depth), [], 0

    def __call__(self, sequence: list[int]) -> list[list[int]]:
        self.cursor = self.context.extend(self.cursor, sequence[self.seen:])  # the request only ever grows
        self.seen = len(sequence)
        node, length = self.context.match(sequence)
        found, span = self.datastore.continuations(sequence, *self.spans, self.k)
        if length and length >= span:
            return [self.most_frequent_path(node)]
        return [self.greedy(found)] if span else []

    def most_frequent_path(self, node: int) -> list[int]:
        chain, tree = [], self.context
        while len(chain) < self.k and tree.children[node]:
            token, node = max(tree.children[node].items(), key=lambda kv: tree.count[kv[1]])
            chain.append(token)
        return chain

    def greedy(self, found) -> list[int]:
        """The most frequent first token of the retrieved continuations, then the most frequent next one..."""
        paths, chain = top_prefixes(found, found.size)[0], ()  # most frequent first
        for path in paths:
            if len(path) == len(chain) + 1 and path[:-1] == chain:
                chain = path
        return list(chain)


CHECKS = {"max_depth": checks.integer(2), "min_span": checks.integer(1), "max_span": checks.at_least_key("min_span", 1),
          "max_matches": checks.integer(1),  # run before any model loads (eagle2.bench.validation)
          **{key: EAGLE2_CHECKS[key] for key in ("profile_dir", "reprofile")}}  # its EAGLE-2 tree's


def build(method_cfg, target, params, generator, weights: dict) -> Eagle2Drafter:
    drafter = build_eagle2(method_cfg, target, params, generator, weights)  # samd.yaml has no lookup_branch

    def get(key, default):
        value = method_cfg.get(key)
        return default if value is None else int(value)

    drafter.lookup = RetrievedChain(weights["rest_datastore"], get("lookup_k", drafter.depth),
                                    max_depth=get("max_depth", 24), max_span=get("max_span", 16),
                                    min_span=get("min_span", 2), max_matches=get("max_matches", 5000))
    return drafter
