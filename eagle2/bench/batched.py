"""The runner's path for ``batch_size`` > 1: every unfinished question turn through ``eagle2.core.batch_engine``.

First turns are queued at once; a later turn of a question is queued when its earlier turn finishes (it
needs that answer). Each finished turn is stored as its row at once, with ``batch_size``, ``batch_id``,
``batch_slot``, ``batch_wall_time_s`` and its span in the run (``batch_admitted_at``, ``batch_retired_at``,
``batch_run_start``: the summary's batch throughput); a failed turn is stored as a failed row and its later
turns skipped.
"""

from __future__ import annotations

import logging
from collections import deque

from omegaconf import OmegaConf

from eagle2.bench.methods import build_drafter
from eagle2.bench.placement import summary as placement_summary
from eagle2.bench.rows import failed_row, fit_prompt, make_row, row_generator, summarize
from eagle2.core.batch_engine import BatchEngine, BatchRequest
from eagle2.prompts.chat import encode_conversation

log = logging.getLogger(__name__)


def decode_batched(cfg, *, chash: str, store, questions: list[dict], target, tokenizer, weights: dict, params,
                   eos: set[int], context: int, fingerprints: dict, kernels: str, logger) -> None:
    """Decode every unfinished turn of ``questions`` in batches of ``cfg.batch_size``, storing each row as it
    finishes (the runner's loaded target, drafter weights and sampling, by name)."""
    queue: deque = deque()
    method = OmegaConf.create(OmegaConf.to_container(cfg.method, resolve=True))
    method.verify_rows = int(cfg.batch_size)  # an auto budget prices a round at this batch size (T_B(q))

    def enqueue(q, turn: int, answers: list[str]) -> None:
        while turn < len(q["turns"]) and store.finished(q["question_id"], turn):
            answers = [*answers, store.finished(q["question_id"], turn)["output_text"]]
            turn += 1
        if turn == len(q["turns"]):
            return
        try:
            prompt = fit_prompt(encode_conversation(tokenizer, cfg.model.template, q["turns"][: turn + 1], answers,
                                                    cfg.model.system_prompt), cfg, context)
        except ValueError as exc:  # a prompt longer than the context: stored and logged as at batch 1
            log.error("question %s turn %d failed: %s", q["question_id"], turn, exc)
            store.append(failed_row(cfg, chash, q["question_id"], turn, exc))
            return
        gen = row_generator(cfg.seed, q["question_id"], turn, target.device)
        drafter = build_drafter(method, target, params, gen, weights=weights)
        queue.append(BatchRequest(prompt, drafter, int(cfg.max_new_tokens), gen, key=(q, turn, answers)))

    def finished(res) -> None:
        q, turn, answers = res.request.key
        if res.error is not None:
            log.error("question %s turn %d failed: %s", q["question_id"], turn, res.error)
            store.append(failed_row(cfg, chash, q["question_id"], turn, res.error))
            return
        batch = {"batch_id": res.batch_id, "batch_slot": res.batch_slot, "batch_wall_time_s": res.batch_wall_time_s,
                 "batch_admitted_at": res.admitted_at, "batch_retired_at": res.retired_at,
                 "batch_run_start": res.run_started}
        row = make_row(cfg, chash, q, turn, res.request.prompt_ids, res.output, tokenizer, fingerprints, kernels,
                       batch, placement=placement_summary(target), drafter=res.request.drafter)
        store.append(row, res.output.nodes)
        logger.log_row(row)
        enqueue(q, turn + 1, [*answers, row["output_text"]])

    for q in questions:
        enqueue(q, 0, [])
    try:
        BatchEngine(target, params, eos, int(cfg.batch_size), context, bool(cfg.get("batch_refill", True))).run(
            queue, finished)
    finally:
        logger.finish(summarize(store, questions))
