"""PARD: K depths drafted by ONE forward of a small draft LM per round (``eagle2.heads.pard_draft``).

The parallel counterpart of SpS (``eagle2.drafters.sps``): the draft keeps its own KV cache of the committed
tokens it has read; each round it feeds the newly committed ones and, in the same forward, K - 1 mask slots behind
the last of them (K = ``depth``): the output at the last token gives depth 1's distribution, slot d depth d + 1's.
The slots' entries are dropped from the cache right after (rejected drafts never enter it: SpS's rollback is that
crop). The round's tree is P-EAGLE's (``eagle2.drafters.peagle``, whose round this drafter reuses): a choice tree
over the K distributions (the best chain with each depth's ``top_k`` - 1 runners-up, or ``choice_tree``), the best
``total_tokens`` nodes by path value (``auto``: the cost profile's count), deterministic top-k choices verified at
temperature > 0 by the rule for deterministically chosen siblings, every drafted node recorded with its depth,
rank and confidence. The draft reads no target feature (``needs_hidden`` is False).
"""

from __future__ import annotations

import torch

from eagle2.core.cache import cache_kwargs, crop, new_cache
from eagle2.drafters.peagle import CHECKS as PEAGLE_CHECKS
from eagle2.drafters.peagle import PEagleDrafter, tree_settings
from eagle2.heads.eagle_head import causal_mask


class PardDrafter(PEagleDrafter):
    shared_forward = False  # row by row: a draft LM over tokens, not a feature-level head

    needs_hidden = False

    def start(self, prompt_ids, first_token, prompt_hidden) -> None:
        self.sequence = list(prompt_ids) + [first_token]
        self.cache = new_cache(self.head.lm)
        self.spans.clear()
        self.cached = 0  # the committed tokens whose keys/values are in self.cache (never a mask slot's)

    def observe(self, new_tokens, hidden) -> None:
        self.sequence.extend(new_tokens)

    def parallel_log_probs(self) -> torch.Tensor:
        """Feed the committed tokens the cache lacks and K - 1 mask slots behind them, in ONE draft forward;
        returns (K, V) log-probabilities of depths 1..K. The slots' entries are dropped before returning."""
        if self.cached == len(self.sequence):  # nothing new (a round commits at least one token): re-feed the last
            self.cached -= 1
            crop(self.cache, self.cached)
        keep, fresh, slots = self.cached, self.sequence[self.cached:], self.depth - 1
        n, base = len(fresh), self.head.lm.base_model
        embeds = self.head.inputs_embeds(torch.tensor(fresh, device=self.device), slots)  # (n + slots, H)
        positions = torch.arange(keep, keep + n + slots, device=self.device)
        with self.spans.span():
            try:
                hidden = base(inputs_embeds=embeds[None], position_ids=positions[None], use_cache=True,
                              attention_mask=causal_mask(n + slots, keep, embeds.dtype, self.device),
                              **cache_kwargs(base, self.cache)).last_hidden_state[0]  # (n + slots, H)
            except BaseException:
                crop(self.cache, keep)  # as it was
                raise
        crop(self.cache, keep + n)  # the slots' entries
        self.cached = keep + n
        return self.log_probs(hidden[n - 1:])


def build(method_cfg, target, params, generator, weights: dict) -> PardDrafter:
    settings = tree_settings(method_cfg, weights, int(method_cfg.depth))
    return PardDrafter(weights["pard_draft"], target.device, **settings)


CHECKS = dict(PEAGLE_CHECKS)  # the same settings: depth, top_k, total_tokens, choice_tree, the profile's
