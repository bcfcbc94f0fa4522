"""PARD: K depths drafted by ONE forward of a small draft LM per round (``eagle2.heads.pard_draft``).

The parallel counterpart of SpS (``eagle2.drafters.sps``): the draft keeps its own KV cache of the committed
tokens it has read; each round it feeds the newly committed ones and, in the same forward, K - 1 mask slots behind
the last of them (K = ``depth``): the output at the last token gives depth 1's distribution, slot d depth d + 1's.
The slots' entries are dropped from the cache right after (rejected drafts never enter it: SpS's rollback is that
crop). The round's tree is P-EAGLE's (``eagle2.drafters.peagle``, whose round this drafter reuses): a choice tree
over the K distributions (the best chain with each depth's ``top_k`` - 1 runners-up, or ``choice_tree``), the best
``total_tokens`` nodes by path value (``auto``: the cost profile's count), deterministic top-k choices verified at
temperature > 0 by the rule for deterministically chosen siblings, every drafted node recorded with its depth,
rank and confidence. The draft reads no target feature (``needs_hidden`` is False). Rows of a batch draft together
(``batch_log_probs``): ONE draft forward a round feeds every row's new tokens and its slots, each row at its own
positions (``eagle2.drafters.head_group``: the draft's cache has a head's layout).
"""

from __future__ import annotations

import torch

from eagle2.core.cache import crop, new_cache
from eagle2.drafters.head_group import TreeHeads
from eagle2.drafters.peagle import CHECKS as PEAGLE_CHECKS
from eagle2.drafters.peagle import PEagleDrafter, tree_settings
from eagle2.heads.eagle_head import causal_mask


class PardDrafter(PEagleDrafter):
    needs_hidden = False

    def start(self, prompt_ids, first_token, prompt_hidden) -> None:
        self.sequence = list(prompt_ids) + [first_token]
        self.cache = new_cache(self.head.lm)
        self.spans.clear()
        self.committed = 0  # the committed tokens whose keys/values are in self.cache (never a mask slot's)
        self.pending_tokens, self.pending_feats = list(self.sequence), []  # the committed tokens it lacks

    def observe(self, new_tokens, hidden) -> None:
        self.sequence.extend(new_tokens)
        self.pending_tokens.extend(new_tokens)

    def ready(self) -> None:
        if not self.pending_tokens:  # nothing new (a round commits at least one token): re-feed the last
            self.committed -= 1
            self.pending_tokens = [self.sequence[self.committed]]

    def parallel_log_probs(self) -> torch.Tensor:
        """Feed the committed tokens the cache lacks and K - 1 mask slots behind them, in ONE draft forward;
        returns (K, V) log-probabilities of depths 1..K. The slots' entries are dropped before returning."""
        self.ready()
        n = len(self.pending_tokens)
        hidden = self._feed_pending(n, self.depth - 1)  # (n + K - 1, H)
        self.caught_up(0, hidden[n - 1])
        return self.log_probs(hidden[n - 1:])

    def _feed_pending(self, count: int, slots: int = 0) -> torch.Tensor:
        """Feed the first ``count`` pending tokens and ``slots`` mask slots behind them in ONE draft forward (no
        slots: a fresh prompt's backlog fed alone); the slots' entries are dropped. Returns the outputs at them
        (count + slots, H)."""
        keep = self.committed
        crop(self.cache, keep)
        embeds = self.head.inputs_embeds(torch.tensor(self.pending_tokens[:count], device=self.device), slots)
        positions = torch.arange(keep, keep + count + slots, device=self.device)
        with self.spans.span():
            try:
                hidden = self.head.hidden(embeds[None], positions[None],
                                          causal_mask(count + slots, keep, embeds.dtype, self.device), self.cache)[0]
            except BaseException:
                crop(self.cache, keep)  # as it was
                raise
        self.committed = keep + count
        crop(self.cache, self.committed)  # the slots' entries
        self.pending_tokens = self.pending_tokens[count:]
        return hidden

    @classmethod
    def batch_log_probs(cls, drafters: list["PardDrafter"], heads: TreeHeads) -> torch.Tensor:
        """(R, K, V): every row's new committed tokens and its K - 1 mask slots in ONE forward of the draft over
        ``heads`` (``TreeHeads.feed_block``: causal, each row at its own positions), then one drafting LM-head
        call."""
        lead = drafters[0]
        tokens, _ = heads.pending_inputs()  # (R, span)
        embeds = lead.head.inputs_embeds(tokens, lead.depth - 1)  # (R, span + K - 1, H)
        out = heads.feed_block(lambda positions, mask, cache: lead.head.hidden(embeds, positions, mask, cache),
                               lead.depth - 1)  # (R, K, H): each row's last token, then its slots
        return lead.shared_log_probs(drafters, out)


def build(method_cfg, target, params, generator, weights: dict) -> PardDrafter:
    settings = tree_settings(method_cfg, weights, int(method_cfg.depth))
    return PardDrafter(weights["pard_draft"], target.device, **settings)


CHECKS = dict(PEAGLE_CHECKS)  # the same settings: depth, top_k, total_tokens, choice_tree, the profile's
