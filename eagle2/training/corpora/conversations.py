"""Two-turn conversations written by the target itself (self-instruct), kept as token shards.

Its job: a training corpus shaped like the benchmarks (MT-bench is two-turn) without their questions.
Per batch of conversations, four batched decodes (``generate``; top-p as ``eagle2.core.sampling`` cuts it):

1. the first user turn: sampled (temperature ~1, top-p, seeded per batch) right after the chat
   template's user header, started with a category opener (writing, roleplay, reasoning, math, coding,
   extraction, STEM, humanities; a few words such as "Write a poem about") so the mix is broad; it
   ends at the end-of-turn token;
2. the target's greedy answer;
3. the second user turn: sampled after the first exchange from the user header and a category-neutral
   opener ("Can you", "Now", ...), so it builds on the first answer;
4. the target's greedy second answer.

Filters: a user turn is dropped when it is too short, did not end within ``max_user_tokens``, or holds
special tokens; and by ``shards.Dedup`` (benchmark n-grams, near-duplicates of earlier kept user turns; a
second turn may repeat its own first).
A dropped first turn drops the conversation; a dropped second turn keeps the first exchange alone.
Counts of every drop are in each shard's ``meta``. Token shards (``shards.py``) are written in batch
order, one per batch, and resume after a kill (the dedup state is rebuilt from the shards written).
Knows nothing of features or training.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from eagle2.core.clock import device_clock
from eagle2.prompts.chat import chat_messages, encode_conversation, render, stop_ids
from eagle2.prompts.questions import all_benchmark_questions
from eagle2.training.corpora import CorpusSource
from eagle2.training.corpora.generate import generate
from eagle2.training.shards import Dedup, read_token_shard, words, write_token_shard

_SENTINEL = "\x00NEXT_USER_TURN\x00"


def user_header_ids(tokenizer, template: str, users: list[str], answers: list[str], system: str | None) -> list[int]:
    """Token ids of the conversation so far up to where the next user message's text starts."""
    if template == "tokenizer":
        text = tokenizer.apply_chat_template(chat_messages(users + [_SENTINEL], answers, system), tokenize=False,
                                             add_generation_prompt=False)
    else:
        text = render(template, users + [_SENTINEL], answers, system)
    return tokenizer(text[: text.index(_SENTINEL)], add_special_tokens=template in ("vicuna", "llama2"))["input_ids"]


def _user_turn(tokenizer, opener: str, new: list[int], stops: set[int], min_tokens: int) -> tuple:
    """(text, None) of a sampled user turn, or (None, why it is dropped)."""
    finished = bool(new) and new[-1] in stops  # (else cut at the token limit)
    body = new[:-1] if finished else new
    special = set(getattr(tokenizer, "all_special_ids", ())) - stops
    if not finished:
        return None, "too_long"
    if any(t in special for t in body):
        return None, "special_tokens"
    text = (opener + tokenizer.decode(body, skip_special_tokens=True)).strip()
    if len(body) < min_tokens or len(words(text)) < 3:
        return None, "too_short"
    return text, None


def _conversation(p1, a1, p2, a2) -> tuple[list[int], list[tuple[int, int]]] | None:
    """(ids, answer spans) of a two-turn conversation, or None when the second prompt (the template
    over the first answer's text) does not repeat the first exchange's tokens."""
    if p2[: len(p1) + len(a1)] != p1 + a1:
        return None
    return p2 + a2, [(len(p1), len(p1) + len(a1)), (len(p2), len(p2) + len(a2))]


def conversation_batch(model, tokenizer, rows: list[tuple[str, str]], follow_ups: list[str], dedup: Dedup, *,
                       template: str, system_prompt: str | None, generator: torch.Generator, stops: set[int],
                       max_user_tokens: int, min_user_tokens: int, max_answer_tokens: int, temperature: float,
                       top_p: float):
    """Conversations for ``rows`` of (category, first-turn opener): (conversations, their records, drop counts)."""
    dropped: Counter = Counter()
    sample = dict(temperature=temperature, top_p=top_p, generator=generator)
    header = user_header_ids(tokenizer, template, [], [], system_prompt)
    prompts = [header + tokenizer(o, add_special_tokens=False)["input_ids"] for _, o in rows]
    firsts = []  # (category, user text, its dedup keys)
    for (cat, opener), new in zip(rows, generate(model, prompts, stops, max_user_tokens, **sample)):
        text, why = _user_turn(tokenizer, opener, new, stops, min_user_tokens)
        why = why or dedup.reason(text)
        if why:
            dropped[f"turn1_{why}"] += 1
            continue
        firsts.append((cat, text, dedup.add(text)))
    if not firsts:
        return [], [], dropped
    p1s = [encode_conversation(tokenizer, template, [u], [], system_prompt) for _, u, _ in firsts]
    a1s = generate(model, p1s, stops, max_answer_tokens)
    a1_texts = [tokenizer.decode(a, skip_special_tokens=True) for a in a1s]
    openers = [follow_ups[int(i)] for i in torch.randint(len(follow_ups), (len(firsts),), generator=generator)]
    prompts = [user_header_ids(tokenizer, template, [u], [a], system_prompt) + tokenizer(o, add_special_tokens=False)[
        "input_ids"] for (_, u, _), a, o in zip(firsts, a1_texts, openers)]
    seconds = {}  # index into firsts -> second user text
    for i, new in enumerate(generate(model, prompts, stops, max_user_tokens, **sample)):
        text, why = _user_turn(tokenizer, openers[i], new, stops, min_user_tokens)
        why = why or dedup.reason(text, allowed=firsts[i][2])
        if why:
            dropped[f"turn2_{why}"] += 1
            continue
        dedup.add(text)
        seconds[i] = text
    idx = sorted(seconds)
    p2s = [encode_conversation(tokenizer, template, [firsts[i][1], seconds[i]], [a1_texts[i]], system_prompt)
           for i in idx]
    a2s = dict(zip(idx, generate(model, p2s, stops, max_answer_tokens))) if idx else {}
    convs, records = [], []
    for i, (cat, u1, _) in enumerate(firsts):
        two = _conversation(p1s[i], a1s[i], p2s[idx.index(i)], a2s[i]) if i in seconds else None
        if i in seconds and two is None:
            dropped["turn2_retokenized"] += 1
        users = [u1, seconds[i]] if two else [u1]
        convs.append(two or (p1s[i] + a1s[i], [(len(p1s[i]), len(p1s[i]) + len(a1s[i]))]))
        records.append({"category": cat, "users": users})
    return convs, records, dropped


def generate_conversations(model, tokenizer, out_dir: str | Path, *, categories: dict[str, list[str]],
                           follow_ups: list[str], template: str, system_prompt: str | None, n_batches: int,
                           batch_size: int, max_user_tokens: int, min_user_tokens: int, max_answer_tokens: int,
                           temperature: float, top_p: float, seed: int, stop_tokens=(), ngram: int = 8,
                           near_duplicate: float = 0.5, benchmarks_dir: str | Path | None = None) -> Path:
    """Write ``n_batches`` token shards ``tokens_NNNNN.npz`` of two-turn conversations (module docstring);
    shards already written are kept and only extend the dedup state (resumable)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dedup = Dedup(all_benchmark_questions(benchmarks_dir), ngram, near_duplicate)
    stops = stop_ids(tokenizer, stop_tokens)
    names = sorted(categories)
    for b in range(n_batches):
        path = out / f"tokens_{b:05d}.npz"
        if path.exists():
            for record in read_token_shard(path)[1].get("conversations", []):
                for u in record["users"]:
                    dedup.add(u)
            continue
        gen = torch.Generator().manual_seed(seed * 100003 + b)
        rows = []
        for r in range(batch_size):  # categories in turn, an opener of each drawn from the seed
            cat = names[(b * batch_size + r) % len(names)]
            rows.append((cat, categories[cat][int(torch.randint(len(categories[cat]), (1,), generator=gen))]))
        t0 = device_clock(model.device)
        convs, records, dropped = conversation_batch(
            model, tokenizer, rows, list(follow_ups), dedup, template=template, system_prompt=system_prompt,
            generator=gen, stops=stops, max_user_tokens=max_user_tokens, min_user_tokens=min_user_tokens,
            max_answer_tokens=max_answer_tokens, temperature=temperature, top_p=top_p)
        seconds = device_clock(model.device) - t0
        meta = {"batch": b, "seed": seed, "requested": batch_size, "conversations": records,
                "dropped": dict(dropped), "seconds": round(seconds, 2), "ngram": ngram,
                "tokens": sum(len(ids) for ids, _ in convs),
                "answer_tokens": sum(e - s for _, spans in convs for s, e in spans)}
        write_token_shard(path, convs, meta)
        print(f"[conversations] batch {b}: {len(convs)} conversations "
              f"({sum(len(r['users']) == 2 for r in records)} two-turn), {meta['tokens']} tokens "
              f"({meta['answer_tokens']} answer), dropped {dict(dropped)}, {seconds:.1f} s", flush=True)
    return out


def conversation_stats(folder: str | Path) -> dict:
    """Totals over a folder's token shards: conversations, two-turn ones, tokens, answer tokens, seconds,
    drops by reason and conversations by category."""
    from eagle2.training.shards import token_shard_paths

    totals: Counter = Counter()
    dropped: Counter = Counter()
    cats: Counter = Counter()
    for path in token_shard_paths(folder):
        meta = read_token_shard(path)[1]
        recs = meta.get("conversations", [])
        totals.update(batches=1, requested=meta.get("requested", 0), conversations=len(recs),
                      two_turn=sum(len(r["users"]) == 2 for r in recs), tokens=meta.get("tokens", 0),
                      answer_tokens=meta.get("answer_tokens", 0))
        totals["seconds"] += meta.get("seconds", 0.0)
        dropped.update(meta.get("dropped", {}))
        cats.update(r["category"] for r in recs)
    return {**totals, "dropped": dict(dropped), "categories": dict(cats)}


def build(target, tokenizer, c, root: Path) -> Path:
    """``stage=conversations``: generate (or finish) the two-turn token corpus of ``train.conversations`` (``c``)."""
    from omegaconf import OmegaConf

    return generate_conversations(
        target, tokenizer, root / c.out_dir, categories=OmegaConf.to_container(c.categories),
        follow_ups=list(c.follow_ups), template=c.template, system_prompt=c.system_prompt, n_batches=c.n_batches,
        batch_size=c.batch_size, max_user_tokens=c.max_user_tokens, min_user_tokens=c.min_user_tokens,
        max_answer_tokens=c.max_answer_tokens, temperature=c.temperature, top_p=c.top_p, seed=c.seed,
        stop_tokens=c.stop_tokens, ngram=c.ngram, near_duplicate=c.near_duplicate)


SOURCE = CorpusSource("conversations", "two-turn self-instruct token shards", build)
