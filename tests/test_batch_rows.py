"""What a user of batched decoding sees of its rows: continuous batching admits a queued request as soon
as a row frees (static waves only after the batch drains), a retired row's cache length goes back to 0 so
later rounds read only live rows' keys, and never-written cache columns are zeros, so garbage in fresh
memory (NaN here, every time) never reaches an output."""

from __future__ import annotations

from collections import deque

import pytest
import torch

import eagle2.core.batch_engine as batch_engine
import eagle2.core.engine as engine
from eagle2.core.batch_cache import BatchCache
from eagle2.core.cache import forward_target, new_cache
from eagle2.core.sampling import SamplingParams
from eagle2.drafters.plain import PlainDrafter

GREEDY = SamplingParams()
# (prompt, max_new_tokens): a short request, a long one, then one that waits for a free row
REQUESTS = [([2, 5, 3], 2), ([7, 7, 3, 9, 4, 11], 14), ([3, 4], 3)]


def run_batch(target, refill: bool, requests=REQUESTS, rows: int = 2):
    queue = deque(batch_engine.BatchRequest(p, PlainDrafter(), n, key=i) for i, (p, n) in enumerate(requests))
    results = {}
    batch_engine.BatchEngine(target, GREEDY, set(), rows, refill=refill).run(queue, lambda r: results.update(
        {r.request.key: r}))
    return [results[i] for i in range(len(requests))]


def test_continuous_batching_admits_into_a_freed_row_at_once(tiny):
    short, long, waiting = run_batch(tiny[0], refill=True)
    assert waiting.admitted_at >= short.retired_at  # it took the short request's row ...
    assert waiting.admitted_at < long.retired_at  # ... while the long one was still decoding
    assert waiting.batch_slot == short.batch_slot and waiting.batch_id == long.batch_id


def test_static_batching_admits_the_next_wave_after_the_batch_drains(tiny):
    short, long, waiting = run_batch(tiny[0], refill=False)
    assert waiting.admitted_at >= long.retired_at and waiting.batch_id == long.batch_id + 1


def test_a_retired_row_reads_no_keys_and_its_length_is_zero(tiny, monkeypatch):
    widths = []
    real = batch_engine.verify_inputs

    def spy(trees, lengths, width, rows):
        widths.append((width, max(lengths[b] for b in trees)))  # the verify's key width, the longest live row
        return real(trees, lengths, width, rows)

    monkeypatch.setattr(batch_engine, "verify_inputs", spy)
    run_batch(tiny[0], refill=False, requests=[([2, 5, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4], 2), ([7, 3], 10)])
    assert len(widths) > 3 and all(width == live for width, live in widths), widths

    cache = BatchCache(tiny[0], 2)
    for row, prompt in enumerate(([1, 2, 3, 4, 5, 6], [1, 2])):
        single = new_cache(tiny[0])
        forward_target(tiny[0], torch.tensor([prompt]), single)
        cache.load_row(row, single)
    cache.free(0)
    assert cache.lengths == [0, 2] and cache.width == 2
    assert all(layer.length == 2 for layer in cache.cache.layers)


@pytest.mark.parametrize("refill", [True, False])
def test_never_written_columns_are_zeros_not_garbage(tiny, nan_empty, refill):
    target = tiny[0]
    requests = [([2, 5], 12), ([7, 7, 3, 9, 4, 11, 8, 8, 2], 6), ([3, 4, 12, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9], 5)]
    expected = [engine.generate(target, PlainDrafter(), p, GREEDY, n, set()).output_ids for p, n in requests]
    got = [r.output.output_ids for r in run_batch(target, refill, requests)]
    assert got == expected
    cache = BatchCache(target, 2)
    for row, prompt in enumerate(([1, 2], [1, 2, 3, 4, 5, 6])):
        single = new_cache(target)
        forward_target(target, torch.tensor([prompt]), single)
        cache.load_row(row, single)
    for layer in cache.cache.layers:  # row 0's columns 2..6 were never written: zeros, not the NaN they started as
        assert torch.equal(layer._k[0, :, 2:6], torch.zeros_like(layer._k[0, :, 2:6]))
        assert torch.equal(layer._v[0, :, 2:6], torch.zeros_like(layer._v[0, :, 2:6]))


@pytest.mark.parametrize("batch_size", [1, 2])
def test_a_prompt_longer_than_the_context_is_stored_and_logged_at_every_batch_size(tmp_path, smollm2, monkeypatch,
                                                                                    caplog, batch_size):
    """A second turn that only its first answer pushes past the context (the check before loading counts
    that answer as empty) fails while decoding: stored as a failed row and logged, at batch 1 and above."""
    import logging

    from eagle2.bench import runner
    from eagle2.prompts.chat import encode_conversation
    from eagle2.prompts.questions import benchmark_file, load_questions
    from tests.test_runner import config, rows

    monkeypatch.setattr(runner, "load_target", lambda _cfg: smollm2)
    turns = load_questions(benchmark_file("mt_bench"), 1)[0]["turns"]
    second = len(encode_conversation(smollm2[1], "tokenizer", turns, [""]))  # its lower bound
    cfg = config("method=plain", "dataset=mt_bench", "dataset.limit=1", "max_new_tokens=4",
                 f"model.max_context={second + 4}", f"batch_size={batch_size}", f"paths.results={tmp_path}")
    with caplog.at_level(logging.ERROR):
        summary = runner.run(cfg)
    first, row = rows(tmp_path)
    assert first["status"] == "ok" and first["output_text"]
    assert row["status"] == "failed" and row["turn"] == 1 and "prompt has" in row["error"]
    assert summary["failed_turns"] == 1
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert logged == [f"question {row['question_id']} turn 1 failed: {row['error'].split(': ', 1)[-1]}"], logged


@pytest.mark.parametrize("refill", [True, False])
def test_the_runner_hands_batch_refill_to_the_engine(tmp_path, smollm2, monkeypatch, refill):
    """At batch 2 a short answer frees its row early: with ``batch_refill=true`` the third question takes that
    row while the long answer still decodes; with ``false`` it waits for the wave to drain (when each turn was
    admitted and retired, from the rows the runner stores)."""
    import json

    from eagle2.bench import runner
    from tests.test_runner import config, rows

    monkeypatch.setattr(runner, "load_target", lambda _cfg: smollm2)
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question_id": i, "turns": [text]}) + "\n" for i, text in enumerate(
        ["What is 2+2? Answer with the number only.", "Write a long story about a dragon.", "Write a poem."])))
    cfg = config("method=plain", f"dataset.path={data}", "max_new_tokens=12", "model.dtype=float32", "batch_size=2",
                 f"batch_refill={str(refill).lower()}", f"paths.results={tmp_path / 'r'}")
    runner.run(cfg)
    short, long, third = sorted(rows(tmp_path / "r"), key=lambda r: r["question_id"])
    assert short["new_tokens"] < long["new_tokens"] == 12  # the rows free at different rounds
    if refill:
        assert third["batch_admitted_at"] < long["batch_retired_at"] and third["batch_id"] == long["batch_id"]
    else:
        assert third["batch_admitted_at"] >= long["batch_retired_at"] and third["batch_id"] == long["batch_id"] + 1
