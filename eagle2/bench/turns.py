"""The one request scheduler of a run, batch 1 and batched alike: every unfinished question turn, decoded by
``eagle2.core.engine.generate`` (batch 1) or ``eagle2.core.batch_engine`` (``batch_size`` > 1).

First turns are queued at once; a later turn of a question is queued when its earlier turn finishes (it
needs that answer): at batch 1 it runs next, so a question's turns run in a row. Each finished turn is
stored as its row at once; a failed turn (a prompt longer than the context, a failed forward, CUDA out of
memory) is stored as a failed row and its later turns skipped. Batched rows also carry ``batch_size``,
``batch_id``, ``batch_slot``, ``batch_wall_time_s`` and their span in the run (``batch_admitted_at``,
``batch_retired_at``, ``batch_run_start``: the summary's batch throughput).
"""

from __future__ import annotations

import logging
from collections import deque

import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from eagle2.bench.methods import build_drafter
from eagle2.bench.placement import summary as placement_summary
from eagle2.bench.rows import failed_row, fit_prompt, make_row, row_generator, summarize
from eagle2.core.batch_engine import BatchEngine, BatchRequest, BatchResult
from eagle2.core.engine import ContextOverflowError, generate
from eagle2.prompts.chat import encode_conversation

log = logging.getLogger(__name__)


def decode_turns(cfg, *, chash: str, store, questions: list[dict], target, tokenizer, weights: dict, params,
                 eos: set[int], context: int, fingerprints: dict, kernels: str, logger,
                 run_state: dict | None = None, compile_s: float | None = None) -> None:
    """Decode every unfinished turn of ``questions``, storing each row as it finishes (the runner's loaded
    target, drafter weights, sampling and drafters' run state, by name)."""
    batch_size, queue = int(cfg.get("batch_size") or 1), deque()
    method = cfg.method
    if batch_size > 1:
        method = OmegaConf.create(OmegaConf.to_container(cfg.method, resolve=True))
        method.verify_rows = batch_size  # an auto budget prices a round at this batch size (T_B(q))
        if cfg.get("batch_drafting", True):
            method.draft_rows = batch_size  # ... drafting every row's tree together (eagle2.drafters.head_group)
    bar = tqdm(total=sum(len(q["turns"]) for q in questions), desc=f"{cfg.method.name} turns")

    def failed(q, turn: int, exc: BaseException) -> None:
        log.error("question %s turn %d failed: %s", q["question_id"], turn, exc)
        store.append(failed_row(cfg, chash, q["question_id"], turn, exc))

    def enqueue(q, turn: int, answers: list[str], first: bool = False) -> None:
        while turn < len(q["turns"]) and store.finished(q["question_id"], turn):
            answers = [*answers, store.finished(q["question_id"], turn)["output_text"]]
            turn += 1
            bar.update(1)
        if turn == len(q["turns"]):
            return
        try:  # a prompt longer than the context, a drafter that cannot be built for it
            prompt = fit_prompt(encode_conversation(tokenizer, cfg.model.template, q["turns"][: turn + 1], answers,
                                                    cfg.model.system_prompt), cfg, context)
            gen = row_generator(cfg.seed, q["question_id"], turn, target.device)
            drafter = build_drafter(method, target, params, gen, weights=weights, run_state=run_state)
        except (ValueError, RuntimeError) as exc:
            return failed(q, turn, exc)
        request = BatchRequest(prompt, drafter, int(cfg.max_new_tokens), gen, key=(q, turn, answers))
        queue.appendleft(request) if first else queue.append(request)

    def finished(res: BatchResult) -> None:
        q, turn, answers = res.request.key
        bar.update(1)
        if res.error is not None:
            return failed(q, turn, res.error)
        batch = None if batch_size == 1 else {
            "batch_id": res.batch_id, "batch_slot": res.batch_slot, "batch_wall_time_s": res.batch_wall_time_s,
            "batch_admitted_at": res.admitted_at, "batch_retired_at": res.retired_at,
            "batch_run_start": res.run_started}
        row = make_row(cfg, chash, q, turn, res.request.prompt_ids, res.output, tokenizer, fingerprints, kernels,
                       batch, placement=placement_summary(target), drafter=res.request.drafter,
                       compile_s=compile_s)
        store.append(row, res.output.nodes)
        logger.log_row(row)
        enqueue(q, turn + 1, [*answers, row["output_text"]], first=batch_size == 1)

    for q in questions:
        enqueue(q, 0, [])
    try:
        if batch_size > 1:
            BatchEngine(target, params, eos, batch_size, context, bool(cfg.get("batch_refill", True)),
                        bool(cfg.get("batch_drafting", True))).run(queue, finished)
        while queue:  # batch 1
            finished(_decode_one(queue.popleft(), target, params, eos, context))
    finally:
        bar.close()
        logger.finish(summarize(store, questions))


def _decode_one(req: BatchRequest, target, params, eos: set[int], context: int) -> BatchResult:
    try:
        out = generate(target, req.drafter, req.prompt_ids, params, req.max_new_tokens, eos, req.generator, context)
    except (ContextOverflowError, RuntimeError) as exc:  # RuntimeError includes CUDA out of memory
        if isinstance(exc, torch.OutOfMemoryError) and torch.device(target.device).type == "cuda":
            torch.cuda.empty_cache()
        return BatchResult(req, None, 0, 0, None, exc)
    return BatchResult(req, out, 0, 0, None)
