"""ShareGPT's first user turns answered by the target itself (the EAGLE-3 recipe's answers), as token shards.

Source: the ShareGPT token shards of ``sharegpt.py``. A conversation's first prompt is its tokens up to its
first answer span (the template-rendered system prompt and first user turn, ending in the assistant
header), so nothing is re-read or re-rendered, and shard k here holds the same conversations as source
shard k: the held-out split (``data.split_shards``: every k-th shard) is the same set of conversations.
Each gets one answer, the target's greedy continuation, decoded by the batched engine
(``eagle2.core.batch_engine``: plain decoding, continuous batching over ``batch_size`` rows) in the
target's loaded precision; it ends at a stop token (kept in the span: the head must learn to stop) or at
``max_new_tokens``. Later turns are not regenerated (their user turns reply to the dataset's answers).

Dropped, counted in each shard's ``meta``: ``prompt_too_long`` (a first prompt over ``max_prompt_tokens``).
Shards are written one at a time, atomically, and a rerun skips those already written (resumable).
Knows nothing of training.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

from eagle2.core.batch_engine import BatchEngine, BatchRequest
from eagle2.core.clock import device_clock
from eagle2.core.sampling import SamplingParams
from eagle2.drafters.plain import PlainDrafter
from eagle2.training.token_shards import Conversation, read_token_shard, token_shard_paths, write_token_shard


def first_prompts(conversations: list[Conversation]) -> list[list[int]]:
    """Each conversation's tokens before its first answer span."""
    return [ids[: spans[0][0]] for ids, spans in conversations]


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


def build_own_answer_shards(target, source_dir: str | Path, out_dir: str | Path, *, stops: set[int],
                            max_prompt_tokens: int = 512, max_new_tokens: int = 256, batch_size: int = 16,
                            shards: int | None = None) -> dict:
    """Answer the first turns of the first ``shards`` source token shards (all: None) into ``out_dir``
    (module docstring); returns the totals over the shards there."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sources = token_shard_paths(source_dir)
    if not sources:
        raise FileNotFoundError(f"no ShareGPT token shards in {source_dir}: run train_head.py stage=sharegpt first")
    totals = {"conversations": 0, "tokens": 0, "answer_tokens": 0, "prompt_too_long": 0, "seconds": 0.0}
    for path in sources[: shards or None]:
        dest = out / path.name
        if not dest.exists():
            convs, meta = read_token_shard(path)
            prompts = first_prompts(convs)
            keep = [i for i, p in enumerate(prompts) if len(p) <= max_prompt_tokens]
            t0 = device_clock(target.device)
            answers = answer_greedily(target, [prompts[i] for i in keep], stops, max_new_tokens, batch_size)
            made = [(prompts[i] + a, [(len(prompts[i]), len(prompts[i]) + len(a))]) for i, a in zip(keep, answers) if a]
            records = meta.get("conversations", [])
            write_token_shard(dest, made, {
                "source": path.name, "answers": "target, greedy", "max_new_tokens": max_new_tokens,
                "conversations": [records[i] for i, a in zip(keep, answers) if a] if records else [],
                "answered": len(made), "prompt_too_long": len(prompts) - len(keep),
                "seconds": round(device_clock(target.device) - t0, 1),
                "tokens": sum(len(ids) for ids, _ in made),
                "answer_tokens": sum(b - a for _, spans in made for a, b in spans)})
        meta = read_token_shard(dest)[1]
        totals["conversations"] += meta["answered"]
        for key in ("tokens", "answer_tokens", "prompt_too_long", "seconds"):
            totals[key] += meta[key]
        print(f"[own_answers] {dest.name}: {meta['answered']} answers, {meta['answer_tokens']} answer "
              f"tokens, {meta['seconds']} s", flush=True)
    return totals
