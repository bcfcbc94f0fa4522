"""ShareGPT's user turns answered by the target itself (the EAGLE-3 recipe's answers), as token shards.

Source: the ShareGPT token shards of ``sharegpt.py``. A conversation's user segments are its tokens before
each answer span (the first: the template-rendered system prompt and first user turn, ending in the assistant
header; each later one: what lies between two answers, i.e. the next user turn and the assistant header), so
nothing is re-read or re-rendered, and shard k here holds the same conversations as source shard k: the
held-out split (``data.split_shards``: every k-th shard) is the same set of conversations.

Turn by turn (``max_turns``, None: all): round k answers, through the batched engine
(``eagle2.core.batch_engine``: plain decoding, continuous batching over ``batch_size`` rows, in the target's
loaded precision), every conversation still going that has a k-th user turn, its prompt being everything made
so far (the earlier user segments and the target's OWN earlier answers) plus that segment. An answer is the
target's greedy continuation, ended by a stop token (kept in the span: the head must learn to stop) or by
``max_new_tokens``; a cut answer ends its conversation (the next user turn would reply to half an answer), and so
does a context that would pass ``max_context_tokens``.

Dropped, counted in each shard's ``meta``: ``prompt_too_long`` (a first prompt over ``max_prompt_tokens``);
``turns`` and ``turns_cut`` count the answered turns and the user turns left unanswered by those rules.
Shards are written one at a time, atomically, and a rerun skips those already written (resumable).
Knows nothing of training.
"""

from __future__ import annotations

from pathlib import Path

from eagle2.core.clock import device_clock
from eagle2.prompts.chat import stop_ids
from eagle2.training.corpora import CorpusSource
from eagle2.training.corpora.generate import generate
from eagle2.training.corpora.prompts import worker_batches
from eagle2.training.shards import Conversation, read_token_shard, token_shard_paths, write_token_shard


def user_segments(conversation: Conversation) -> list[list[int]]:
    """The tokens before each answer span that are not an earlier answer (module docstring)."""
    ids, spans = conversation
    starts = [0] + [end for _, end in spans[:-1]]
    return [ids[a:b] for a, (b, _) in zip(starts, spans)]


def answer_turns(target, segments: list[list[list[int]]], stops: set[int], *, max_new_tokens: int,
                 batch_size: int, max_prompt_tokens: int, max_context_tokens: int,
                 max_turns: int | None = None) -> tuple[list[Conversation], dict]:
    """Each conversation's user ``segments`` answered turn by turn (module docstring); returns every
    conversation as made (no answer: no spans) and the counts."""
    made: list[Conversation] = [([], []) for _ in segments]
    going = [len(segs[0]) <= max_prompt_tokens for segs in segments]
    counts = {"prompt_too_long": going.count(False), "turns": 0, "turns_cut": 0}
    for turn in range(max(map(len, segments), default=0) if max_turns is None else max_turns):
        asked = [i for i, segs in enumerate(segments) if going[i] and turn < len(segs)]
        prompts = {i: made[i][0] + segments[i][turn] for i in asked}
        too_long = [i for i in asked if len(prompts[i]) + max_new_tokens > max_context_tokens and turn > 0]
        for i in too_long:
            going[i] = False
        asked = [i for i in asked if going[i]]
        answers = generate(target, [prompts[i] for i in asked], stops, max_new_tokens, batch_size=batch_size)
        for i, answer in zip(asked, answers):
            ids, spans = prompts[i] + answer, made[i][1] + [(len(prompts[i]), len(prompts[i]) + len(answer))]
            made[i] = (ids, spans) if answer else made[i]
            going[i] = bool(answer) and answer[-1] in stops
            counts["turns"] += bool(answer)
    counts["turns_cut"] = sum(len(segs) for segs, (_, spans) in zip(segments, made) if spans) - counts["turns"]
    return made, counts


def build_own_answer_shards(target, source_dir: str | Path, out_dir: str | Path, *, stops: set[int],
                            max_prompt_tokens: int = 512, max_new_tokens: int = 256, batch_size: int = 16,
                            shards: int | None = None, max_turns: int | None = None,
                            max_context_tokens: int = 1024, worker: int = 0, workers: int = 1) -> dict:
    """Answer the user turns (the first ``max_turns``; None: all) of the first ``shards`` source token shards
    (all: None) into ``out_dir`` (module docstring); returns the totals over the shards there. ``workers``
    processes (``worker`` = 0..workers-1) can share the shards: each answers shards worker, worker + workers, ...
    first, then helps with the others' (``prompts.worker_batches``; a shard already written is skipped)."""
    if not 0 <= worker < workers:
        raise ValueError(f"train.own_answers.worker={worker} must be in 0..workers-1 (workers={workers})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sources = token_shard_paths(source_dir)
    if not sources:
        raise FileNotFoundError(f"no ShareGPT token shards in {source_dir}: run train_head.py stage=sharegpt first")
    totals = {"conversations": 0, "turns": 0, "tokens": 0, "answer_tokens": 0, "prompt_too_long": 0, "seconds": 0.0}
    sources = sources[: shards or None]
    for path in (sources[i] for i in worker_batches(list(range(len(sources))), worker, workers)):
        dest = out / path.name
        if not dest.exists():
            convs, meta = read_token_shard(path)
            segments = [user_segments(c) for c in convs]
            t0 = device_clock(target.device)
            every, counts = answer_turns(target, segments, stops, max_new_tokens=max_new_tokens, batch_size=batch_size,
                                        max_prompt_tokens=max_prompt_tokens, max_context_tokens=max_context_tokens,
                                        max_turns=max_turns)
            records = meta.get("conversations", [])
            answered = [i for i, (_, spans) in enumerate(every) if spans]
            made = [every[i] for i in answered]
            write_token_shard(dest, made, {
                "source": path.name, "answers": "target, greedy", "max_new_tokens": max_new_tokens,
                "max_turns": max_turns, "conversations": [records[i] for i in answered] if records else [],
                "answered": len(made), **counts, "seconds": round(device_clock(target.device) - t0, 1),
                "tokens": sum(len(ids) for ids, _ in made),
                "answer_tokens": sum(b - a for _, spans in made for a, b in spans)})
        meta = read_token_shard(dest)[1]
        totals["conversations"] += meta["answered"]
        for key in ("turns", "tokens", "answer_tokens", "prompt_too_long", "seconds"):
            totals[key] += meta.get(key, meta["answered"] if key == "turns" else 0)
        print(f"[own_answers] {dest.name}: {meta['answered']} conversations, {meta.get('turns', meta['answered'])} "
              f"turns, {meta['answer_tokens']} answer tokens, {meta['seconds']} s", flush=True)
    return totals


def build(target, tokenizer, c, root: Path) -> Path:
    """``stage=own_answers``: the target's answers of ``train.own_answers`` (``c``) to its source's user turns."""
    out = root / c.out_dir
    totals = build_own_answer_shards(target, root / c.source, out, stops=stop_ids(tokenizer, c.stop_tokens),
                                     max_prompt_tokens=c.max_prompt_tokens, max_new_tokens=c.max_new_tokens,
                                     batch_size=c.batch_size, shards=c.shards, max_turns=c.get("max_turns"),
                                     max_context_tokens=c.get("max_context_tokens", 1024),
                                     worker=int(c.get("worker", 0)), workers=int(c.get("workers", 1)))
    print(f"[own_answers] {totals['conversations']} conversations ({totals['turns']} turns), {totals['tokens']} "
          f"tokens ({totals['answer_tokens']} answer), {totals['prompt_too_long']} prompts too long, "
          f"{totals['seconds']:.0f} s decoding", flush=True)
    return out


SOURCE = CorpusSource("own_answers", "token shards of the target's own answers", build, needs="sharegpt")
