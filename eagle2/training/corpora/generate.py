"""The batched decoders that write corpora: the target answering (or continuing) many prompts at once.

Knows nothing of chat templates, shards or training.
"""

from __future__ import annotations

from collections import deque

import torch

from eagle2.core.batch_engine import BatchEngine, BatchRequest
from eagle2.core.cache import forward_target, new_cache
from eagle2.core.features import LayerTap
from eagle2.core.sampling import SamplingParams
from eagle2.drafters.plain import PlainDrafter
from eagle2.training.features import features_of


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention mask, position ids), each (B, longest): the prompts right-aligned after
    ``pad_id`` padding, positions counted from each row's first real token."""
    batch, width = len(prompts), max(len(p) for p in prompts)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    mask = torch.zeros((batch, width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids):] = torch.tensor(ids)
        mask[row, width - len(ids):] = 1
    return input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def answer_batch(model, prompt_ids: list[list[int]], eos_ids: set[int], max_new_tokens: int,
                 temperature: float, generator: torch.Generator, pad_id: int, tap: LayerTap | None = None):
    """Decode a left-padded batch; return per-row (token ids, features, response_start). Features are
    the post-norm hidden states, followed (with ``tap``) by the tapped layers' inputs."""
    batch, width = len(prompt_ids), max(len(p) for p in prompt_ids)
    input_ids, mask, positions = left_padded(prompt_ids, pad_id)
    cache = new_cache(model)
    hidden = forward_target(model, input_ids, cache, attention_mask=mask, position_ids=positions)
    step_feats = features_of(hidden, tap)
    feats = [[step_feats[row, width - len(prompt_ids[row]):]] for row in range(batch)]
    n_feats = [len(p) for p in prompt_ids]
    tokens = [list(p) for p in prompt_ids]
    alive = torch.ones(batch, dtype=torch.bool)
    last = hidden[:, -1]
    for _ in range(max_new_tokens):
        logits = model.lm_head(last).float()  # (B, V)
        if temperature > 0:
            nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)[:, 0]
        else:
            nxt = logits.argmax(-1)
        for row in torch.nonzero(alive)[:, 0].tolist():
            tokens[row].append(int(nxt[row]))
            if int(nxt[row]) in eos_ids:
                alive[row] = False
        if not alive.any():
            break
        mask = torch.cat([mask, torch.ones((batch, 1), dtype=torch.long)], dim=1)
        positions = positions[:, -1:] + 1
        hidden = forward_target(model, nxt[:, None], cache, attention_mask=mask, position_ids=positions)
        last = hidden[:, -1]
        step_feats = features_of(hidden, tap)
        for row in range(batch):
            if n_feats[row] < len(tokens[row]):  # rows that finished earlier record nothing
                feats[row].append(step_feats[row])
                n_feats[row] += 1
    out = []
    for row in range(batch):
        f = torch.cat(feats[row], dim=0)
        n = min(len(tokens[row]), f.shape[0])
        out.append((tokens[row][:n], f[:n], len(prompt_ids[row])))
    return out



def _next_token(logits: torch.Tensor, temperature: float, top_p: float, generator) -> torch.Tensor:
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / temperature, -1)
    if top_p < 1:
        sorted_p, order = probs.sort(-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p > top_p  # keep the smallest prefix reaching top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p.masked_fill(outside, 0.0))
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


@torch.no_grad()
def sample_batch(model, prompts: list[list[int]], stops: set[int], max_new_tokens: int, *, temperature: float = 0.0,
                 top_p: float = 1.0, generator: torch.Generator | None = None, pad_id: int = 0):
    """Decode a left-padded batch; per row (new token ids, ended with a stop token?). Greedy at
    ``temperature`` 0, else nucleus sampling from ``generator``."""
    batch = len(prompts)
    input_ids, mask, positions = left_padded(prompts, pad_id)
    cache = new_cache(model)
    last = forward_target(model, input_ids, cache, attention_mask=mask, position_ids=positions)[:, -1]
    out, ended = [[] for _ in range(batch)], [False] * batch
    for step in range(max_new_tokens):
        nxt = _next_token(model.lm_head(last).float(), temperature, top_p, generator)
        for row in range(batch):
            if not ended[row]:
                out[row].append(int(nxt[row]))
                ended[row] = int(nxt[row]) in stops
        if all(ended) or step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones((batch, 1), dtype=torch.long)], dim=1)
        positions = positions[:, -1:] + 1
        last = forward_target(model, nxt[:, None], cache, attention_mask=mask, position_ids=positions)[:, -1]
    return list(zip(out, ended))


def answer_greedily(target, prompts: list[list[int]], stops: set[int], max_new_tokens: int,
                    batch_size: int) -> list[list[int]]:
    """The target's greedy answer to each prompt (a stop token, when reached, ends it and is kept)."""
    answers: list[list[int] | None] = [None] * len(prompts)
    queue = deque(BatchRequest(p, PlainDrafter(), max_new_tokens, key=i) for i, p in enumerate(prompts))

    def finished(res) -> None:
        if res.error is not None:
            raise res.error
        ids = list(res.output.output_ids)
        end = next((i + 1 for i, t in enumerate(ids) if t in stops), len(ids))
        answers[res.request.key] = ids[:end]

    BatchEngine(target, SamplingParams(), stops, batch_size).run(queue, finished)
    return answers
