"""The one batched decoder every corpus is written with: the batch engine (``eagle2.core.batch_engine``:
continuous batching, the plain drafter, in the target's loaded precision) over many prompts at once, greedy or
sampled by ``eagle2.core.sampling``'s rule (its top-p keeps every token tied with the last one it needs).

Knows nothing of chat templates, shards or training; the features of what it decoded are ``features.py``'s
(one teacher-forced forward).
"""

from __future__ import annotations

from collections import deque

import torch

from eagle2.core.batch_engine import BatchEngine, BatchRequest
from eagle2.core.sampling import SamplingParams
from eagle2.drafters.plain import PlainDrafter


def generate(target, prompts: list[list[int]], stops: set[int], max_new_tokens: int, *, batch_size: int | None = None,
             temperature: float = 0.0, top_p: float = 1.0, generator: torch.Generator | None = None) -> list[list[int]]:
    """The target's continuation of each prompt: at most ``max_new_tokens`` new ids, ended by (and keeping) the
    first stop token; greedy at ``temperature`` 0, else sampled from ``generator`` (one stream for all rows).
    ``batch_size`` rows decode at once (default: all the prompts)."""
    answers: list[list[int] | None] = [None] * len(prompts)
    queue = deque(BatchRequest(list(p), PlainDrafter(), max_new_tokens, generator=generator, key=i)
                  for i, p in enumerate(prompts))

    def finished(res) -> None:
        if res.error is not None:
            raise res.error
        ids = list(res.output.output_ids)
        answers[res.request.key] = ids[:next((i + 1 for i, t in enumerate(ids) if t in stops), len(ids))]

    params = SamplingParams(temperature=temperature, top_p=top_p)
    BatchEngine(target, params, stops, batch_size or max(len(prompts), 1)).run(queue, finished)
    return answers

