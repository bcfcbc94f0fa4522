"""DFlash: a block of tokens drafted by ONE forward of a block-diffusion draft model (``eagle2.heads.dflash_head``).

Each round the draft model writes the newly committed positions' fused target features into its layers' keys and
values and, in the same forward, denoises the block behind them: the root (the last committed token, whose feature
the target has not computed yet) then ``block_size`` - 1 mask tokens, attending to each other and to the whole
context. Slot k's output is the distribution of the token k places past the root, so a round drafts K =
``block_size`` - 1 depths whatever its tree (the paper's single denoising step). The block's cache entries are
dropped at the next round; the context's stay.

The tree is P-EAGLE's (``eagle2.drafters.peagle``, whose drafter this one is but for the forward): a choice tree
over the K distributions, by default the chain of each slot's best token (``top_k=1``, the paper's draft) with
``top_k`` - 1 runners-up per depth as siblings, the best ``total_tokens`` nodes by path value (or ``auto``: the cost
profile's count). The choices are deterministic (top-k), so at temperature > 0 they are verified by the rule for
deterministically chosen siblings. Every drafted node is recorded with its depth, rank and confidence. Rows of a
batch draft together (``batch_log_probs``): ONE draft forward a round writes every row's context and denoises every
row's block, each row at its own positions (``eagle2.drafters.head_group``).
"""

from __future__ import annotations

import torch

from eagle2.core.cache import crop
from eagle2.drafters import setting_checks as checks
from eagle2.drafters.eagle_common import drafting_lm_head, drafting_settings
from eagle2.drafters.head_group import TreeHeads
from eagle2.drafters.peagle import CHECKS as PEAGLE_CHECKS
from eagle2.drafters.peagle import PEagleDrafter, tree_settings
from eagle2.heads.static_head import forward_head


class DFlashDrafter(PEagleDrafter):
    def __init__(self, head, device, *, lm_head_dtype: torch.dtype | None = None, **tree):
        super().__init__(head, device, **tree)
        if lm_head_dtype is not None:  # a cached copy of the target's LM head in that dtype (drafting only)
            self.lm_head, self.lm_head_dtype = drafting_lm_head(self.lm_head, lm_head_dtype), lm_head_dtype

    def parallel_log_probs(self) -> torch.Tensor:
        """Feed the pending context features and denoise the block behind them in ONE forward; returns (K, V)
        log-probabilities of depths 1..K over the vocabulary."""
        block = self.block(torch.tensor(self.pending_tokens[-1:], device=self.device))[0]
        out = self._feed_pending(len(self.pending_tokens), block)  # (K + 1, h)
        self.caught_up(0, out[0])
        return self.log_probs(out[1:])

    def block(self, anchors: torch.Tensor) -> torch.Tensor:
        """The blocks (R, K + 1) behind ``anchors`` (R,): each anchor (the row's last committed token), then K mask
        tokens."""
        block = torch.full((anchors.shape[0], self.depth + 1), self.head.mask_token_id, dtype=torch.long,
                           device=self.device)
        block[:, 0] = anchors
        return block

    def _feed_pending(self, count: int, block: torch.Tensor | None = None) -> torch.Tensor:
        """Write the first ``count`` pending context features into the cache and, in the same forward, denoise
        ``block`` (Q,) behind them (none: one mask token, a fresh prompt's backlog fed alone); the block's entries
        are dropped. Returns the block's outputs (Q, h)."""
        if block is None:
            block = torch.tensor([self.head.mask_token_id], device=self.device)
        feats = torch.cat([f.to(self.device, self.dtype) for f in self.pending_feats])  # (n, k*H)
        crop(self.cache, self.committed)  # the last round's block
        positions = torch.arange(self.committed, self.committed + count + block.shape[0], device=self.device)
        with self.spans.span():
            out = self.head(block[None], feats[None, :count], position_ids=positions[None], cache=self.cache)[0]
        self.committed += count
        crop(self.cache, self.committed)  # the block's
        self.pending_tokens, self.pending_feats = self.pending_tokens[count:], [feats[count:]]
        return out

    @classmethod
    def batch_log_probs(cls, drafters: list["DFlashDrafter"], heads: TreeHeads) -> torch.Tensor:
        """(R, K, V): every row's context features and its block drafted in ONE forward of the draft model over
        ``heads`` (``TreeHeads.feed_block``: the context sends no query, the block sees all of itself), then one
        drafting LM-head call."""
        lead = drafters[0]
        tokens, feats = heads.pending_inputs()  # (R, span), (R, span, k*H)
        block = lead.block(tokens[torch.arange(len(drafters)), heads.pending - 1])  # (R, K + 1)
        out = heads.feed_block(lambda positions, mask, cache: forward_head(lead.head, block, feats, positions, mask,
                                                                           cache),
                               block.shape[1], context_queries=False, bidirectional=True)  # (R, K + 1, h)
        return lead.shared_log_probs(drafters, out[:, 1:])


def build(method_cfg, target, params, generator, weights: dict) -> DFlashDrafter:
    head = weights["dflash_head"]
    block = int(method_cfg.get("block_size") or head.block_size)
    if block > head.block_size:
        raise ValueError(f"method.block_size={block} is longer than the DFlash draft model's block "
                         f"({head.block_size}, the length it was trained to denoise)")
    return DFlashDrafter(head, target.device, **tree_settings(method_cfg, weights, block - 1),
                         lm_head_dtype=drafting_settings(method_cfg, head)["lm_head_dtype"])


CHECKS = {**{k: v for k, v in PEAGLE_CHECKS.items() if k != "depth"},
          "block_size": checks.Check("null (the draft model's own) or an integer >= 2",
                                     lambda value, _cfg: value is None or checks.is_int(value) and int(value) >= 2)}
