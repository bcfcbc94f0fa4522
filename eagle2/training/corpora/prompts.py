"""The prompts corpus: instruction prompts answered by the target (self-distillation), as feature shards.

Prompts come from the files shipped in ``data/train`` (Alpaca and Code Alpaca instructions with ``input``
appended when present; GSM8K train questions), minus every prompt whose text equals an evaluation question of
the six benchmarks. Answers come from the target itself (``generate``: the batched engine, greedy or sampled;
a sampled corpus draws as ``eagle2.core.sampling`` does, not as the decoder this corpus had before, so its
answers differ from an older build's while greedy ones are the same), or, with ``answers``, are the dataset's
own; either way the target's features of the whole sequence come from one teacher-forced forward
(``features.py``) and are written as feature shards (``shards.py``) atomically, so a killed run resumes where
it stopped.
``mtbench_heldout`` is the same corpus over MT-bench first turns, answered greedily: the headline held-out set.
"""

from __future__ import annotations

import contextlib
import gzip
import json
from pathlib import Path

import torch
from tqdm import tqdm

from eagle2.core.features import LayerTap
from eagle2.prompts.chat import encode_conversation, stop_ids
from eagle2.prompts.questions import all_benchmark_questions
from eagle2.training.corpora import CorpusSource
from eagle2.training.corpora.generate import generate
from eagle2.training.features import corpus_tap_layers, teacher_forced_batch
from eagle2.training.shards import check_existing_taps, write_shard


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
    check_existing_taps(out, tap_layers)
    with contextlib.ExitStack() as stack:
        tap = stack.enter_context(LayerTap(model, tap_layers)) if tap_layers else None
        for b in worker_batches(order, worker, workers):
            batch = batches[b]
            path = out / f"shard_{b:05d}.safetensors"
            if path.exists():
                continue
            prompt_ids = [e[2] for e in batch]
            given = [e[3] for e in batch] if answers is not None else generate(
                model, prompt_ids, eos_ids, max_new_tokens, temperature=temperature,
                generator=torch.Generator().manual_seed(seed * 100003 + b))
            rows = teacher_forced_batch(model, [p + a for p, a in zip(prompt_ids, given)],
                                        [len(p) for p in prompt_ids], pad_id, tap)
            write_shard(path, rows, model.config.hidden_size, tap_layers)
            bar.update(1)
    bar.close()
    return out


def worker_batches(order: list[int], worker: int, workers: int) -> list[int]:
    """The batches ``worker`` writes, in turn: its own share (every ``workers``-th of the seeded random
    order, so a partial corpus is an unbiased sample of the prompts), then the other workers' shares from
    the end backwards, so a worker that finishes early takes over work that is still waiting (batches
    already written are skipped when their turn comes; two workers duplicate at most the batch they meet on)."""
    mine = order[worker::workers]
    taken = set(mine)
    return mine + [b for b in reversed(order) if b not in taken]


def mtbench_heldout(target, tokenizer, out_dir: str | Path, *, template: str, system_prompt: str | None,
                    max_new_tokens: int, batch_size: int = 16, limit: int | None = None,
                    benchmark: str = "mt_bench", benchmarks_dir: str | Path | None = None,
                    stop_tokens=(), tap_layers=()) -> Path:
    """Greedy target answers to the benchmark's first turns, as feature shards in ``out_dir`` (resumable;
    reused when already complete), with the ``tap_layers`` inputs when given."""
    from eagle2.prompts.questions import benchmark_file, load_questions

    questions = load_questions(benchmark_file(benchmark, benchmarks_dir), limit)
    return build_corpus(target, tokenizer, [q["turns"][0] for q in questions], out_dir, template=template,
                        system_prompt=system_prompt, batch_size=batch_size, max_new_tokens=max_new_tokens,
                        max_prompt_tokens=1 << 30, temperature=0.0, samples_per_prompt=1, seed=0,
                        stop_tokens=stop_tokens, tap_layers=tap_layers)


def build(target, tokenizer, c, root: Path) -> Path:
    """``stage=corpus``: build (or finish) the self-distillation corpus of ``train.corpus`` (``c``)."""
    records = training_records([root / f for f in ([c.prompts] if isinstance(c.prompts, str) else c.prompts)])
    if c.limit:
        records = records[: int(c.limit)]
    if c.responses not in ("self", "dataset"):
        raise ValueError(f"train.corpus.responses must be 'self' or 'dataset', not {c.responses!r}")
    return build_corpus(target, tokenizer, [p for p, _ in records], root / c.out_dir, template=c.template,
                        system_prompt=c.system_prompt, batch_size=c.batch_size, max_new_tokens=c.max_new_tokens,
                        max_prompt_tokens=c.max_prompt_tokens, temperature=c.temperature,
                        samples_per_prompt=c.samples_per_prompt, seed=c.seed, max_batches=c.max_batches,
                        worker=c.worker, workers=c.workers, stop_tokens=c.stop_tokens,
                        answers=[a for _, a in records] if c.responses == "dataset" else None,
                        tap_layers=corpus_tap_layers(target, c.get("tap_layers")), only_batches=c.get("batches"))


SOURCE = CorpusSource("corpus", "feature shards of the target's answers to prompts", build, order=0, files=("prompts",))
