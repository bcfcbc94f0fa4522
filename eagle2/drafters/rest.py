"""REST, retrieval-based speculative decoding (He et al., NAACL 2024): no draft model; each round the
longest suffix of the context (``max_span`` tokens down to ``min_span``) is looked up in a datastore
(``eagle2.heads.rest_datastore``), the next ``continuation`` tokens of up to ``max_matches`` occurrences
are retrieved, and the ``num_draft`` most frequent of their prefixes form the draft trie (the authors'
defaults: spans 16..2, 5000 matches, 10 tokens, 64 nodes).

Nodes are chosen deterministically, so at temperature > 0 they are accepted by the rule for
deterministically chosen siblings (``eagle2.core.accept``): lossless at any temperature. A node's
confidence is its count over its parent's. The datastore is drafter data of the model (``model.rest_datastore``,
built by ``python -m experiments.ops.build_datastore``) and loaded once per run.

``num_draft=auto``: each round keeps, of up to ``max_num_draft`` retrieved nodes, the ``m`` most frequent
(a node's path value is its count over the retrieved total: the frequency estimate of its acceptance) that
maximise expected tokens per second under the measured cost profile (``eagle2.drafters.budget``), as
EAGLE-2's ``total_tokens=auto`` does with its head's confidences.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle2.core.tree import DraftTree
from eagle2.drafters import setting_checks as checks
from eagle2.drafters.budget import CostProfile, best_budget
from eagle2.drafters.counted_trie import tree_from_counts
from eagle2.heads.rest_datastore import Datastore, top_prefixes


@dataclass(frozen=True)
class RestSettings:
    max_span: int = 16
    min_span: int = 2
    max_matches: int = 5000
    continuation: int = 10
    num_draft: int = 64

    def __post_init__(self):
        if not 1 <= self.min_span <= self.max_span or min(self.max_matches, self.continuation, self.num_draft) < 1:
            raise ValueError("REST needs 1 <= min_span <= max_span and max_matches, continuation, num_draft >= 1")


class RestDrafter:
    needs_hidden = False
    forward_time = 0.0  # no model forwards

    def __init__(self, datastore: Datastore, settings: RestSettings, profile: CostProfile | None = None):
        self.datastore, self.settings, self.profile = datastore, settings, profile

    def start(self, prompt_ids, first_token, prompt_hidden) -> None:
        self.sequence = list(prompt_ids) + [first_token]

    def observe(self, new_tokens, hidden) -> None:
        self.sequence.extend(new_tokens)

    def propose(self, root: int, room: int) -> DraftTree:
        s = self.settings
        if room < 2:
            return DraftTree.root_only(root)
        found, span = self.datastore.continuations(self.sequence, s.max_span, s.min_span, s.max_matches,
                                                   s.continuation)
        if not span:
            return DraftTree.root_only(root)
        paths, counts = top_prefixes(found, min(s.num_draft, room - 1))
        meta = {}
        if self.profile is not None and paths:
            paths, counts, meta = self._best_budget(paths, counts, len(found))
        return tree_from_counts(root, paths, counts, len(found), matched_span=span, retrieved=len(found), **meta)

    def _best_budget(self, paths, counts, total):
        """The ``m`` most frequent nodes that maximise expected tokens per second; a node's count never exceeds
        its parent's, so (count, then depth) order keeps every kept node's parent."""
        order = sorted(range(len(paths)), key=lambda i: (-counts[i], len(paths[i])))
        budget, expected, seconds = best_budget(torch.tensor([counts[i] / total for i in order]), self.profile, 1)
        kept = set(order[:budget])
        meta = {"budget_mode": "auto", "expected_tokens": expected, "predicted_round_s": seconds}
        return [p for i, p in enumerate(paths) if i in kept], [c for i, c in enumerate(counts) if i in kept], meta


CHECKS = {"min_span": checks.integer(1), "max_span": checks.at_least_key("min_span", 1),
          "max_matches": checks.integer(1), "continuation": checks.integer(1),
          "num_draft": checks.integer_or("auto", 1),
          "max_num_draft": checks.integer(1, "64")}  # run before any model loads (eagle2.bench.validation)


def build(method_cfg, target, params, generator, weights: dict) -> RestDrafter:
    auto = str(method_cfg.get("num_draft")) == "auto"
    given = {key: method_cfg[key] for key in RestSettings.__dataclass_fields__ if method_cfg.get(key) is not None}
    if auto:
        given["num_draft"] = method_cfg.get("max_num_draft") or 64
    settings = RestSettings(**{key: int(value) for key, value in given.items()})
    return RestDrafter(weights["rest_datastore"], settings, weights.get("cost_profile") if auto else None)
