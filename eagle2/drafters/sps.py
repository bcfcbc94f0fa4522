"""Vanilla speculative sampling: a small draft LM (same tokenizer) proposes a chain of k tokens.

The draft keeps its own KV cache. It remembers which tokens its cache holds; before each proposal it
rolls back to the longest prefix that agrees with the committed sequence and feeds the rest.
Greedy drafts are argmaxes (deterministic); sampled drafts carry ``q_draft`` for acceptance.
"""

from __future__ import annotations

import time

import torch

from eagle2.cache import cache_kwargs, crop, new_cache
from eagle2.sampling import SamplingParams, probabilities
from eagle2.tree import DraftTree


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class SpsDrafter:
    needs_hidden = False

    def __init__(self, draft_model, params: SamplingParams, k: int, generator: torch.Generator | None):
        if k < 1:
            raise ValueError("method.k (draft tokens per round) must be >= 1")
        self.model, self.params, self.k, self.generator = draft_model, params, k, generator
        self.forward_time = 0.0

    def start(self, prompt_ids, first_token, prompt_hidden) -> None:
        self.sequence = list(prompt_ids) + [first_token]
        self.cache = new_cache(self.model)
        self.fed: list[int] = []  # tokens whose keys/values are in self.cache

    def observe(self, new_tokens, hidden) -> None:
        self.sequence.extend(new_tokens)

    def _forward(self, tokens: list[int]) -> torch.Tensor:
        t0 = time.perf_counter()
        ids = torch.tensor([tokens], device=self.model.device)
        logits = self.model(input_ids=ids, use_cache=True, logits_to_keep=1,
                            **cache_kwargs(self.model, self.cache)).logits[0, -1]
        self.fed.extend(tokens)
        self.forward_time += time.perf_counter() - t0
        return logits

    def propose(self, root: int, room: int) -> DraftTree:
        keep = _common_prefix(self.fed, self.sequence)
        if keep == len(self.sequence):  # always re-feed at least the root to get its logits
            keep -= 1
        crop(self.cache, keep)
        del self.fed[keep:]
        logits = self._forward(self.sequence[keep:])
        drafted, q_rows, conf = [], [], []
        for step in range(min(self.k, room - 1)):
            if self.params.greedy:
                probs = torch.softmax(logits.float(), -1)
                token = int(probs.argmax())
            else:
                probs = probabilities(logits, self.params)
                token = int(torch.multinomial(probs, 1, generator=self.generator))
            drafted.append(token)
            q_rows.append(probs)
            conf.append(float(probs[token]))
            if step + 1 < min(self.k, room - 1):
                logits = self._forward([token])
        q_draft = None
        if not self.params.greedy and drafted:
            q_draft = torch.cat([torch.zeros_like(q_rows[0])[None], torch.stack(q_rows)])  # row 0: the root
        return DraftTree.chain(root, drafted, confidence=torch.tensor([1.0, *conf]), q_draft=q_draft)
