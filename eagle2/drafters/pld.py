"""Prompt lookup decoding (PLD): no draft model; the draft is what followed an earlier occurrence of
the last n tokens in the prompt or the output so far (``eagle2.drafters.lookup``), a chain of up to ``k``
tokens, or a trie of up to ``branches`` such chains.

Drafts are chosen deterministically (no ``q_draft``), so at temperature > 0 they are accepted by the
rule for deterministically chosen children (``eagle2.core.accept``): lossless at any temperature. A round
with no match verifies the root alone (one plain step).
"""

from __future__ import annotations

import torch

from eagle2.core.tree import DraftTree
from eagle2.drafters.lookup import LookupSettings, chains_to_tree, find_chains


class PldDrafter:
    needs_hidden = False
    forward_time = 0.0  # no model forwards

    def __init__(self, settings: LookupSettings):
        self.settings = settings

    def start(self, prompt_ids, first_token, prompt_hidden) -> None:
        self.sequence = list(prompt_ids) + [first_token]

    def observe(self, new_tokens, hidden) -> None:
        self.sequence.extend(new_tokens)

    def propose(self, root: int, room: int) -> DraftTree:
        chains = find_chains(self.sequence, self.settings) if room > 1 else []
        if not chains:
            return DraftTree.root_only(root)
        tree = chains_to_tree(root, chains, room - 1, meta={"lookup_chains": len(chains)})
        tree.confidence = torch.ones(len(tree))
        return tree


def lookup_settings(method_cfg, prefix: str = "", default_k: int = 4) -> LookupSettings:
    """LookupSettings from a method config's ``<prefix>k``, ``<prefix>max_ngram``, ``<prefix>min_ngram``,
    ``<prefix>branches`` (a missing or null key takes the default)."""
    def get(key, default):
        value = method_cfg.get(prefix + key)
        return default if value is None else int(value)

    return LookupSettings(k=get("k", default_k), max_ngram=get("max_ngram", 3), min_ngram=get("min_ngram", 1),
                          branches=get("branches", 1))


def build(method_cfg, target, params, generator, weights: dict) -> PldDrafter:
    return PldDrafter(lookup_settings(method_cfg))
