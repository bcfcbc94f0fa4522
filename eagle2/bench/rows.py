"""One stored row per decoded question turn, shared by the sequential runner and the batched path.

``make_row`` turns a decode's output into the row (every field the schema in ``row_schema`` checks),
``failed_row`` records a turn or a whole run that failed, ``summarize`` totals a run's rows, and
``fit_prompt`` / ``row_generator`` give each turn its context-fitted prompt and its own sampling stream.
"""

from __future__ import annotations

import logging
import time
import zlib

import torch
from omegaconf import DictConfig, OmegaConf

from eagle2.bench import compile_choice
from eagle2.bench.gpu_facts import gpu_facts, peak_memory_mb
from eagle2.bench.profile_checks import stamp
from eagle2.bench.prompt_lengths import fits, overflow_message, room, too_long_policy
from eagle2.core.cpu import cpu_kind
from eagle2.core.engine import ContextOverflowError
from eagle2.core.precision import dtype_name
from eagle2.results.row_schema import check_row
from eagle2.results.store import ResultStore
from eagle2.results.throughput import batch_throughput

log = logging.getLogger(__name__)


def fit_prompt(prompt: list[int], cfg: DictConfig, context: int) -> list[int]:
    """``prompt`` as decoded: as it is when it fits (``prompt_lengths.fits``), its last tokens under
    ``too_long_prompts=truncate_left``, else a ``ContextOverflowError`` (a turn the check before loading
    could not see: its earlier answers made it too long)."""
    if fits(len(prompt), cfg, context):
        return prompt
    if too_long_policy(cfg) != "truncate_left":
        raise ContextOverflowError(f"{overflow_message(len(prompt), cfg, context)}; lower max_new_tokens or set "
                                   "too_long_prompts=truncate_left")
    keep = room(cfg, context)
    log.warning("prompt of %d tokens truncated to its last %d", len(prompt), keep)
    return prompt[-keep:]


def row_generator(seed: int, question_id, turn: int, device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(zlib.crc32(f"{seed}/{question_id}/{turn}".encode()))
    return gen


def authors_budget(method_cfg) -> dict:
    """This method's tree budget as the EAGLE authors' code counts it (their ``total_token`` counts the
    root, their ``depth`` the expansions after the first layer: ours (8, 3, 4) = their (9, 2, 4); ``auto``
    is their -1); empty for methods without a (total_tokens, depth, top_k) budget."""
    if not all(method_cfg.get(k) is not None for k in ("total_tokens", "depth", "top_k")):
        return {}
    total = method_cfg.total_tokens
    return {"total_token": -1 if str(total) == "auto" else int(total) + 1, "depth": int(method_cfg.depth) - 1,
            "top_k": int(method_cfg.top_k)}


def make_row(cfg, chash, question, turn, prompt, out, tokenizer, fingerprints: dict, kernels: str,
             batch: dict | None = None, placement: str = "unrecorded", drafter=None,
             compile_s: float | None = None) -> dict:
    records = [r.record() for r in out.rounds]
    keys = dict.fromkeys(key for r in records for key in r)  # every round's (a policy's plain round has fewer)
    rounds = {key: [r.get(key) for r in records] for key in keys}
    decoded = sum(out.accept_lengths)
    return checked({
        "question_id": question["question_id"], "turn": turn, "category": question.get("category"),
        "dataset": cfg.dataset.name, "model": cfg.model.name, "method": cfg.method.name,
        "temperature": float(cfg.temperature), "top_p": float(cfg.top_p), "top_k": int(cfg.top_k),
        "seed": int(cfg.seed), "max_new_tokens": int(cfg.max_new_tokens), "config_hash": chash,
        "ignore_eos": bool(cfg.get("ignore_eos", False)),
        "dtype": dtype_name(cfg.model.dtype), "status": "ok", "error": None,
        "prompt_tokens": len(prompt), "prompt_ids": list(prompt), "new_tokens": out.new_tokens,
        "wall_time_s": out.wall_time_s,
        "prefill_time_s": out.prefill_time_s, "target_forwards": out.target_forwards,
        "tokens_per_s": decoded / out.wall_time_s if out.wall_time_s > 0 else None,
        "e2e_tokens_per_s": end_to_end_rate(out.new_tokens, out.prefill_time_s, out.wall_time_s),
        "tau": decoded / out.target_forwards if out.target_forwards else None,
        "accept_lengths": out.accept_lengths, "output_ids": out.output_ids,
        "output_text": tokenizer.decode(out.output_ids, skip_special_tokens=True),
        "rounds": rounds, "peak_memory_mb": peak_memory_mb(cfg.model.device), "gpu": gpu_facts(cfg.model.device),
        "method_config": OmegaConf.to_container(cfg.method, resolve=True), "authors_budget": authors_budget(cfg.method),
        "weights": fingerprints, "cpu_kind": cpu_kind(), "kernels": kernels, "placement": placement,
        "timestamp": time.time(), "cost_profile": stamp(getattr(drafter, "profile", None)),
        "compile": compile_choice.resolve(cfg), "compile_s": compile_s,
        "batch_size": int(cfg.get("batch_size") or 1), "batch_id": None, "batch_slot": None, "batch_wall_time_s": None,
        "batch_drafting": bool(cfg.get("batch_drafting", True)) if int(cfg.get("batch_size") or 1) > 1 else None,
        "batch_admitted_at": None, "batch_retired_at": None, "batch_run_start": None, "serving": None,
        **(batch or {}),
    })


def end_to_end_rate(new_tokens: int, prefill_s: float, decode_s: float) -> float | None:
    """New tokens over the whole generation, prefill included (the authors' tokens/s: their clock
    starts before the prompt's forward)."""
    total = prefill_s + decode_s
    return new_tokens / total if total > 0 else None


def checked(row: dict) -> dict:
    check_row(row)
    return row


def failed_row(cfg, chash, question_id, turn, exc: BaseException, **extra) -> dict:
    return checked({"question_id": question_id, "turn": turn, "dataset": cfg.dataset.name, "model": cfg.model.name,
                    "method": cfg.method.name, "temperature": float(cfg.temperature), "seed": int(cfg.seed),
                    "dtype": dtype_name(cfg.model.dtype), "config_hash": chash, "status": "failed",
                    "error": f"{type(exc).__name__}: {exc}", "timestamp": time.time(), **extra})


def _failure(row: dict) -> str:
    return f"question {row['question_id']} turn {row['turn']}: {row['error']}"


def summarize(store: ResultStore, questions: list[dict]) -> dict:
    """Totals over this run's question turns (tokens/s as total tokens over total decode time), and the
    turns that failed in this run (``failed_turns``, ``first_failure``); for rows
    decoded in batches also the batch throughput (all new tokens over the batch's wall span), the mean
    per-request decode rate and the mean request latency (``eagle2.results.throughput``)."""
    ids = {q["question_id"] for q in questions}
    rows = [r for (qid, _), r in store.done.items() if qid in ids]
    decoded = sum(sum(r["accept_lengths"]) for r in rows)
    wall = sum(r["wall_time_s"] for r in rows)
    prefill = sum(r.get("prefill_time_s") or 0.0 for r in rows)
    forwards = sum(r["target_forwards"] for r in rows)
    new_tokens = sum(r["new_tokens"] for r in rows)
    failed = [r for key, r in store.failed.items() if key[0] in ids and key not in store.done]
    return {"turns": len(rows), "failed_turns": len(failed), "first_failure": _failure(failed[0]) if failed else None,
            "new_tokens": new_tokens,
            "decode_time_s": wall, "tokens_per_s": decoded / wall if wall else None,
            "prefill_time_s": prefill, "e2e_tokens_per_s": end_to_end_rate(new_tokens, prefill, wall),
            "tau": decoded / forwards if forwards else None, "results": str(store.rows_path),
            "batch_size": max((int(r.get("batch_size") or 1) for r in rows), default=1), **batch_throughput(rows)}
