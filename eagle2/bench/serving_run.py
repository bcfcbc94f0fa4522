"""``experiment=serving``: one run serves the first turns of the questions as an open-loop load at one rate.

The rate is ``serving.rate_fraction`` of plain decoding's saturated request rate on this machine at this batch
size: all requests waiting at once, plain drafters, at most ``batch_size`` rows (measured once and cached under
``~/.cache/eagle2/serving``, keyed by the target, its settings, the batch size, the token limit and the prompts,
so every method at one fraction sees the same arrival times; ``serving.saturated_rps`` sets it instead).
Arrivals follow ``serving.seed`` (``eagle2.bench.serving.poisson_arrivals``). Each request is stored as a row like
every other run's, with the batch facts and ``serving``: its times (arrival, admission, first token, finish,
TTFT, TPOT, end-to-end) and the rate's (fraction, requests per second, the saturated rate it is a fraction of).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from omegaconf import OmegaConf

from eagle2.bench.methods import build_drafter
from eagle2.bench.placement import summary as placement_summary
from eagle2.bench.rows import failed_row, fit_prompt, make_row, row_generator
from eagle2.bench.serving import EngineRows, WallClock, poisson_arrivals, serve
from eagle2.core.batch_engine import BatchEngine, BatchRequest
from eagle2.prompts.chat import encode_conversation

CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eagle2" / "serving"


def _prompts(cfg, questions, tokenizer, context) -> list[tuple[dict, list[int]]]:
    return [(q, fit_prompt(encode_conversation(tokenizer, cfg.model.template, q["turns"][:1], [],
                                               cfg.model.system_prompt), cfg, context)) for q in questions]


def _engine(cfg, target, params, eos, context) -> BatchEngine:
    return BatchEngine(target, params, eos, int(cfg.batch_size), context, True, bool(cfg.get("batch_drafting", True)))


def _served(cfg, target, params, eos, context, requests, arrivals, on_finish) -> None:
    engine = _engine(cfg, target, params, eos, context)
    rows = EngineRows(engine)
    try:
        serve(rows, requests, arrivals, engine.rows, WallClock(target.device), on_finish)
    finally:
        rows.close()


def saturated_rps(cfg, target, params, eos, context, prompts, kernels: str) -> float:
    """Plain decoding's requests per second with every request waiting at the start (cached; see the module)."""
    if cfg.serving.get("saturated_rps"):
        return float(cfg.serving.saturated_rps)
    facts = {"model": OmegaConf.to_container(cfg.model, resolve=True), "batch_size": int(cfg.batch_size),
             "max_new_tokens": int(cfg.max_new_tokens), "kernels": kernels, "threads": torch.get_num_threads(),
             "compile": str(cfg.get("engine", {}).get("compile")), "prompts": [p for _, p in prompts]}
    key = hashlib.sha1(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = CACHE_DIR / f"{key}.json"
    if path.exists():
        return float(json.loads(path.read_text())["saturated_rps"])
    plain = OmegaConf.create({"name": "plain"})
    requests = [BatchRequest(p, build_drafter(plain, target, params, None), int(cfg.max_new_tokens))
                for _, p in prompts]
    ends = []
    _served(cfg, target, params, eos, context, requests, [0.0] * len(requests),
            lambda req, timing, out: ends.append(timing.finished))
    rate = len(ends) / max(ends)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"saturated_rps": rate, "facts": {k: v for k, v in facts.items() if k != "prompts"}}))
    return rate


def serve_turns(cfg, *, chash: str, store, questions: list[dict], target, tokenizer, weights: dict, params,
                eos: set[int], context: int, fingerprints: dict, kernels: str, logger, run_state: dict | None = None,
                compile_s: float | None = None) -> None:
    """Serve every question's first turn at the configured rate and store each as its row."""
    every = _prompts(cfg, questions, tokenizer, context)
    prompts = [(q, p) for q, p in every if not store.finished(q["question_id"], 0)]
    if not prompts:
        return
    batch_size = int(cfg.batch_size)
    method = OmegaConf.create(OmegaConf.to_container(cfg.method, resolve=True))
    if batch_size > 1:  # an auto budget and the policy price a round at this batch size
        method.verify_rows = batch_size
        if cfg.get("batch_drafting", True):
            method.draft_rows = batch_size
    saturated = saturated_rps(cfg, target, params, eos, context, prompts, kernels)
    rate = float(cfg.serving.rate_fraction) * saturated
    all_questions = [q for q, _ in every]
    # one arrival per question of the run, drawn for all of them: a rerun serves the unfinished at their times
    times = dict(zip([q["question_id"] for q in all_questions],
                     poisson_arrivals(len(all_questions), rate, int(cfg.serving.seed))))
    requests = []
    for q, prompt in prompts:
        gen = row_generator(cfg.seed, q["question_id"], 0, target.device)
        drafter = build_drafter(method, target, params, gen, weights=weights, run_state=run_state)
        requests.append(BatchRequest(prompt, drafter, int(cfg.max_new_tokens), gen, key=q))
    rate_facts = {"rate_fraction": float(cfg.serving.rate_fraction), "rate_rps": rate, "saturated_rps": saturated,
                  "seed": int(cfg.serving.seed)}

    def finished(request, timing, output) -> None:
        q = request.key
        if output is None:
            store.append(failed_row(cfg, chash, q["question_id"], 0, ValueError("the prompt does not fit")))
            return
        facts = {"batch_id": 0, "batch_slot": None, "batch_wall_time_s": timing.finished - timing.first_token,
                 "batch_admitted_at": timing.admitted, "batch_retired_at": timing.finished,
                 "batch_run_start": None, "serving": {**timing.record(), **rate_facts}}
        row = make_row(cfg, chash, q, 0, request.prompt_ids, output, tokenizer, fingerprints, kernels, facts,
                       placement=placement_summary(target), drafter=request.drafter, compile_s=compile_s)
        store.append(row, output.nodes)
        logger.log_row(row)

    _served(cfg, target, params, eos, context, requests, [times[q["question_id"]] for q, _ in prompts], finished)
