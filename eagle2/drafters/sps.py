"""Vanilla speculative sampling: a small draft LM (same tokenizer) proposes a chain of k tokens.

The draft keeps its own KV cache. It remembers which tokens its cache holds; before each proposal it
rolls back to the longest prefix that agrees with the committed sequence and feeds the rest.
Greedy drafts are argmaxes (deterministic); sampled drafts carry ``q_draft`` for acceptance.

Draft temperature (``method.draft_temperature``; None = the target's settings): when the target
samples (temperature > 0), drafts are sampled from, and ``q_draft`` records, the draft's distribution
at ``draft_temperature`` with the target's top-k and top-p still applied (to the draft's own logits),
so a draft never proposes from the tail those settings cut. Any such q is lossless: acceptance uses
exactly the q the token was drawn from. ``draft_temperature=0`` makes greedy drafts, accepted by the
rule for deterministically chosen children. When the target is greedy, drafts are greedy whatever
``draft_temperature`` says (greedy acceptance never reads q). Each sampled draft token is one
``Draws.categorical`` call (``eagle2.core.sampling``), so a test can enumerate every drafted chain.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from eagle2.core.cache import crop, forward_target, new_cache
from eagle2.core.clock import Spans
from eagle2.core.sampling import Draws, SamplingParams, as_draws, probabilities
from eagle2.core.tree import DraftTree


def draft_params(params: SamplingParams, draft_temperature: float | None) -> SamplingParams:
    """The settings drafts are drawn with: the target's, with the temperature replaced when it samples."""
    if params.greedy or draft_temperature is None:
        return params
    return replace(params, temperature=float(draft_temperature))


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class SpsDrafter:
    needs_hidden = False

    def __init__(self, draft_model, params: SamplingParams, k: int, generator: torch.Generator | Draws | None,
                 draft_temperature: float | None = None):
        if k < 1:
            raise ValueError("method.k (draft tokens per round) must be >= 1")
        self.model, self.k = draft_model, k
        self.params = draft_params(params, draft_temperature)
        self.draws = as_draws(generator)
        self.spans = Spans(draft_model.device)  # its own forwards, read after the generation

    def start(self, prompt_ids, first_token, prompt_hidden) -> None:
        self.sequence = list(prompt_ids) + [first_token]
        self.cache = new_cache(self.model)
        self.spans.clear()
        self.fed: list[int] = []  # tokens whose keys/values are in self.cache

    def observe(self, new_tokens, hidden) -> None:
        self.sequence.extend(new_tokens)

    def _forward(self, tokens: list[int]) -> torch.Tensor:
        with self.spans.span():
            ids = torch.tensor([tokens], device=self.model.device)  # (the compiled path's cache: compiled)
            logits = self.model.lm_head(forward_target(self.model, ids, self.cache)[0, -1])
        self.fed.extend(tokens)
        return logits

    def _draft_token(self, logits: torch.Tensor) -> tuple[int, torch.Tensor]:
        """(the next draft token, the distribution it was chosen from)."""
        if self.params.greedy:
            probs = torch.softmax(logits.float(), -1)
            return int(probs.argmax()), probs
        probs = probabilities(logits, self.params)
        return self.draws.categorical(probs), probs

    def propose(self, root: int, room: int) -> DraftTree:
        keep = _common_prefix(self.fed, self.sequence)
        if keep == len(self.sequence):  # always re-feed at least the root to get its logits
            keep -= 1
        crop(self.cache, keep)
        del self.fed[keep:]
        logits = self._forward(self.sequence[keep:])
        drafted, q_rows, conf = [], [], []
        for step in range(min(self.k, room - 1)):
            token, probs = self._draft_token(logits)
            drafted.append(token)
            q_rows.append(probs)
            conf.append(float(probs[token]))
            if step + 1 < min(self.k, room - 1):
                logits = self._forward([token])
        q_draft = None
        if not self.params.greedy and drafted:
            q_draft = torch.cat([torch.zeros_like(q_rows[0])[None], torch.stack(q_rows)])  # row 0: the root
        return DraftTree.chain(root, drafted, confidence=torch.tensor([1.0, *conf]), q_draft=q_draft)


def build(method_cfg, target, params, generator, weights: dict) -> SpsDrafter:
    return SpsDrafter(weights["sps_draft"], params, int(method_cfg.k), generator,
                      draft_temperature=method_cfg.get("draft_temperature"))
