"""Training corpus for draft heads and draft models: prompts, and the target's own answers.

Prompts come from the files shipped in ``data/train`` (Alpaca and Code Alpaca instructions with
``input`` appended when present; GSM8K train questions), minus every prompt whose text equals an
evaluation question of the six benchmarks. Answers come from the
target itself (self-distillation; or, with ``answers``, the dataset's own answers read by the target
under teacher forcing): batched decoding with left padding, greedy or sampled, recording
the target's last hidden state (after its final norm, the tensor its LM head multiplies) at every
position, which is exactly the feature an EAGLE head consumes; with ``tap_layers`` (EAGLE-3) also the
hidden states entering those decoder layers. Shards are written atomically as safetensors, so a
killed run resumes where it stopped.

Shard layout: ``tokens`` (N,) int32, ``features`` (N, H) fp16, ``offsets`` (B+1,) int64 sequence
boundaries, ``response_start`` (B,) int64 index of the first answer token within each sequence, and
with taps ``layer_features`` (N, k*H) fp16 (the k tapped layers' inputs, concatenated in layer order)
plus ``tap_layers`` (k,) int64. Optional ``answer_mask`` (N,) uint8 (1 at answer tokens) for sequences with
several answers (two-turn conversations, ``token_shards.py``); without it the answer is ``[response_start, n)``.
"""

from __future__ import annotations

import contextlib
import gzip
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from eagle2.core.cache import forward_target, new_cache
from eagle2.core.features import LayerTap, eagle3_layers
from eagle2.prompts.chat import encode_conversation, stop_ids
from eagle2.prompts.questions import all_benchmark_questions


def _read_records(path: Path) -> list[dict]:
    """Records of a ``.json`` list or ``.jsonl`` lines, either gzip-compressed (``.json.gz``, ``.jsonl.gz``,
    as data/train ships them); a plain name whose file exists only compressed reads the compressed one."""
    if not path.exists() and path.with_name(path.name + ".gz").exists():
        path = path.with_name(path.name + ".gz")
    compressed = path.suffix == ".gz"
    text = gzip.decompress(path.read_bytes()).decode() if compressed else path.read_text()
    if (path.with_suffix("") if compressed else path).suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def _prompt_and_answer(record: dict, path: Path) -> tuple[str, str]:
    if "instruction" in record:  # Alpaca / Code Alpaca
        prompt = record["instruction"] + ("\n" + record["input"] if record.get("input") else "")
        return prompt.strip(), record.get("output", "")
    if "question" in record:  # GSM8K
        return record["question"].strip(), record.get("answer", "")
    raise ValueError(f"{path}: a record has neither 'instruction' nor 'question': {sorted(record)}")


def training_records(paths, benchmarks_dir: str | Path | None = None) -> list[tuple[str, str]]:
    """(prompt, the dataset's own answer) pairs of one prompt file or several (``.json`` lists of
    Alpaca-style records or ``.jsonl`` GSM8K-style lines, plain or ``.gz``), in file order, every benchmark
    question removed."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    pairs = [_prompt_and_answer(r, Path(p)) for p in paths for r in _read_records(Path(p))]
    held_out = all_benchmark_questions(benchmarks_dir)
    return [(p, a) for p, a in pairs if p not in held_out]


def training_prompts(paths, benchmarks_dir: str | Path | None = None) -> list[str]:
    """Training prompts with every benchmark question removed."""
    return [p for p, _ in training_records(paths, benchmarks_dir)]


def _features(hidden: torch.Tensor, tap: LayerTap | None) -> torch.Tensor:
    """The recorded features of a forward: post-norm hidden states, then the tapped layers' inputs."""
    return hidden if tap is None else torch.cat([hidden, tap.read().to(hidden.dtype)], dim=-1)


@torch.no_grad()
def teacher_forced_batch(model, sequences: list[list[int]], starts: list[int], pad_id: int,
                         tap: LayerTap | None = None):
    """Features of given (prompt + answer) sequences from one right-padded forward."""
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
    feats = _features(forward_target(model, input_ids, new_cache(model), attention_mask=mask), tap)
    return [(ids, feats[row, : len(ids)], start) for row, (ids, start) in enumerate(zip(sequences, starts))]


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
    step_feats = _features(hidden, tap)
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
        step_feats = _features(hidden, tap)
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


def write_shard(path: Path, rows, hidden_size: int, tap_layers: tuple[int, ...] = ()) -> None:
    """Write rows of (token ids, features (n, H or H + k*H), response_start) as one shard; rows may carry
    a fourth item, an (n,) 0/1 ``answer_mask`` (several answer spans per sequence), written as ``answer_mask``."""
    tokens = torch.tensor([t for r in rows for t in r[0]], dtype=torch.int32)
    features = torch.cat([r[1] for r in rows]).to(torch.float16)
    lengths = torch.tensor([len(r[0]) for r in rows])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    starts = torch.tensor([r[2] for r in rows], dtype=torch.long)
    tensors = {"tokens": tokens, "features": features[:, :hidden_size].contiguous(), "offsets": offsets,
               "response_start": starts}
    if any(len(r) > 3 for r in rows):
        tensors["answer_mask"] = torch.cat([r[3].to(torch.uint8) if len(r) > 3 else
                                            (torch.arange(len(r[0])) >= r[2]).to(torch.uint8) for r in rows])
    if tap_layers:
        tensors["layer_features"] = features[:, hidden_size:].contiguous()
        tensors["tap_layers"] = torch.tensor(tap_layers, dtype=torch.long)
    tmp = path.with_suffix(".partial")
    save_file(tensors, str(tmp))
    tmp.rename(path)


def read_shards(folder: str | Path) -> list[dict[str, torch.Tensor]]:
    return [load_file(str(p)) for p in sorted(Path(folder).glob("shard_*.safetensors"))]


def iter_shards(folder: str | Path):
    """The shards of ``folder`` one at a time (one in memory at once, unlike ``read_shards``)."""
    for p in sorted(Path(folder).glob("shard_*.safetensors")):
        yield load_file(str(p))


def build_corpus(model, tokenizer, prompts: list[str], out_dir: str | Path, *, template: str,
                 system_prompt: str | None, batch_size: int, max_new_tokens: int, max_prompt_tokens: int,
                 temperature: float, samples_per_prompt: int, seed: int, max_batches: int | None = None,
                 worker: int = 0, workers: int = 1, answers: list[str] | None = None, stop_tokens=(),
                 tap_layers=(), only_batches=None) -> Path:
    """Answer every prompt ``samples_per_prompt`` times; resumable shard by shard. Batches run in a
    seeded random order; ``max_batches`` stops after that many (a reproducible random subset).
    ``workers`` processes (``worker`` = 0..workers-1) can share the work: each takes every
    ``workers``-th batch of the order, then helps with the others' (``worker_batches``). With ``answers``
    (one per prompt, e.g. the dataset's own) the target does not answer: it reads those answers (teacher
    forcing, each closed by the EOS) and only its features are kept. An answer ends at the EOS or one of
    ``stop_tokens`` (the model config's).
    ``tap_layers`` (decoder layer indices, e.g. ``eagle3_layers(L)``) also records their inputs.
    ``only_batches`` (batch indices) writes exactly those shards instead of the seeded order (e.g. to rebuild
    a copied subset: batches are fixed by the prompts, and greedy answers by the batch)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    eos_ids = stop_ids(tokenizer, stop_tokens)
    eos_end = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    encoded = []
    for sample in range(samples_per_prompt if answers is None else 1):
        for i, p in enumerate(prompts):
            ids = encode_conversation(tokenizer, template, [p], [], system_prompt)
            if len(ids) <= max_prompt_tokens:
                given = None if answers is None else (
                    tokenizer(answers[i], add_special_tokens=False)["input_ids"][:max_new_tokens - 1]
                    + eos_end)
                encoded.append((sample, i, ids, given))
    encoded.sort(key=lambda e: len(e[2]))  # similar lengths share a batch: less padding
    batches = [encoded[i:i + batch_size] for i in range(0, len(encoded), batch_size)]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    done = sum(1 for b in range(len(batches)) if (out / f"shard_{b:05d}.safetensors").exists())
    bar = tqdm(total=len(batches), initial=done, desc="self-distillation batches")
    order = torch.randperm(len(batches), generator=torch.Generator().manual_seed(seed)).tolist()
    if only_batches is not None:
        order = [int(b) for b in only_batches]
    elif max_batches is not None:
        order = order[:max_batches]
        bar.total = len(order)
        bar.n = sum(1 for b in order if (out / f"shard_{b:05d}.safetensors").exists())
    tap_layers = tuple(int(i) for i in tap_layers or ())
    _check_existing_taps(out, tap_layers)
    with contextlib.ExitStack() as stack:
        tap = stack.enter_context(LayerTap(model, tap_layers)) if tap_layers else None
        for b in worker_batches(order, worker, workers):
            batch = batches[b]
            path = out / f"shard_{b:05d}.safetensors"
            if path.exists():
                continue
            if answers is None:
                gen = torch.Generator().manual_seed(seed * 100003 + b)
                rows = answer_batch(model, [e[2] for e in batch], eos_ids, max_new_tokens, temperature, gen,
                                    pad_id, tap)
            else:
                rows = teacher_forced_batch(model, [e[2] + e[3] for e in batch], [len(e[2]) for e in batch],
                                            pad_id, tap)
            write_shard(path, rows, model.config.hidden_size, tap_layers)
            bar.update(1)
    bar.close()
    return out


def corpus_tap_layers(target, setting) -> tuple[int, ...]:
    """The decoder layers whose inputs the corpus records: ``eagle3`` (2, L//2, L-3), a list, or none."""
    if not setting:
        return ()
    if setting == "eagle3":
        return eagle3_layers(target.config.num_hidden_layers)
    return tuple(int(i) for i in setting)


def worker_batches(order: list[int], worker: int, workers: int) -> list[int]:
    """The batches ``worker`` writes, in turn: its own share (every ``workers``-th of the seeded random
    order, so a partial corpus is an unbiased sample of the prompts), then the other workers' shares from
    the end backwards, so a worker that finishes early takes over work that is still waiting (batches
    already written are skipped when their turn comes; two workers duplicate at most the batch they meet on)."""
    mine = order[worker::workers]
    taken = set(mine)
    return mine + [b for b in reversed(order) if b not in taken]


def _check_existing_taps(folder: Path, tap_layers: tuple[int, ...]) -> None:
    """A corpus is resumed only with the layer taps its shards were written with."""
    from safetensors import safe_open

    existing = next(iter(sorted(folder.glob("shard_*.safetensors"))), None)
    if existing is None:
        return
    with safe_open(str(existing), framework="pt") as f:
        had = tuple(f.get_tensor("tap_layers").tolist()) if "tap_layers" in f.keys() else ()
    if had != tap_layers:
        raise ValueError(f"{folder} was written with tap_layers={list(had)}, not {list(tap_layers)}: use another "
                         "out_dir (or delete it to rebuild)")
