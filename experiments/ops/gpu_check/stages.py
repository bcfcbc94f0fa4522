# ruff: noqa: E501 (the stage table in the docstring)
"""The GPU check's stages on random-weight models at the real shapes (``experiments.ops.gpu_check.models``): each stage a few rows, each row with its pass criterion (``criterion``) and ``status`` ok / failed / skipped.

| stage | what | ok means |
|---|---|---|
| ``audit_vicuna7b`` | Vicuna-7B shape in its config's dtype (fp16): first the tolerance, measured on this model (``experiments.research.numeric_tolerance``'s statistic over calibration prompts: ``error_ratio_max``/``_p99``, ``tolerance_factor`` its suggested factor); then plain and EAGLE-2 greedy on other random prompts, identity audit against the fp32 model with that factor | 0 algorithmic, >= 1 draft token accepted |
| ``audit_llama31_8b`` | the same, LLaMA-3.1-8B shape in its config's dtype (fp16) | the same |
| ``exact_fp32`` | Vicuna-7B width at reduced depth in fp32 | EAGLE-2 identical to plain in every turn, >= 1 accepted |
| ``verify_cost`` | T(q)/T(1), q in ``VERIFY_QS`` (1..64) after each context of ``verify_contexts`` (512 and 1984: context + q up to the authors' 2048), both shapes: GPU time (CUDA events, the inputs on the device before the start event, launches hidden behind ``torch.cuda._sleep``) beside wall time | CUDA: GPU-time T(64)/T(1) <= 2 (a 7B forward is weight-bound on a GPU), GPU time <= 1.1 x wall, 0 host syncs inside the timed section |
| ``draft_cost`` | one EAGLE-2 drafting round at depths 1..D: EAGLE-1/2 head (Vicuna-7B), EAGLE-3 head (LLaMA-3.1-8B) | CUDA: each depth past the 2nd adds at most twice the 2nd's cost (+10% of T(1)) |
| ``syncs`` | host-device syncs per EAGLE-2 round at T=0 and at T=1 (stochastic acceptance, a CUDA generator): implicit (``torch.cuda.set_sync_debug_mode``), explicit (``torch.cuda.synchronize``) | implicit <= 4 D + 8 per round (provisional until measured) |
| ``cuda_graphs`` | the compiled path (``engine.compile=true``) with CUDA graphs at the Vicuna-7B shape (``experiments.ops.gpu_check.graphs``): plain and EAGLE-2 greedy, eager then compiled, the rounds captured and replayed | CUDA: the same tokens as eager, graph replays in use, implicit syncs per round no more than eager's |

On CUDA the shapes are the real ones (all layers; ``exact_fp32`` 4 layers) and the EAGLE-2 budget the model config's; on a CPU (the CPU half) 2-layer narrow proxies (head dimension 8, real vocabularies) and a small budget, so the whole set runs in seconds (``syncs`` needs CUDA: skipped).

``python -m experiments.ops.gpu_check.stages STAGE --device cuda --rows FILE`` runs one stage and rewrites FILE (a JSON list of rows) after every row: ``experiments.ops.gpu_check`` runs each stage so, in a child process with a time limit, and keeps what a killed stage wrote.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle2.core.clock import device_clock
from eagle2.core.engine import generate
from eagle2.core.sampling import SamplingParams
from experiments.ops.gpu_check import models as gm
from experiments.ops.gpu_check.graphs import cuda_graphs
from experiments.ops.gpu_check.models import config_dtype, drafter, eagle2_budget
from experiments.ops.gpu_check.verify_timing import (
    VERIFY_QS,
    VERIFY_RATIO_MAX,
    count_syncs,
    cuda_syncs,
    gpu_timer,
    sampled,
    timed_section_syncs,
    verify_ok,
    wall_timer,
)

ROOT = Path(__file__).resolve().parents[3]
STAGES = ("audit_vicuna7b", "audit_llama31_8b", "exact_fp32", "verify_cost", "draft_cost", "syncs", "cuda_graphs")
LIMITS_S = {"audit_vicuna7b": 80, "audit_llama31_8b": 80, "exact_fp32": 40, "verify_cost": 125, "draft_cost": 50,
            "syncs": 50, "cuda_graphs": 50}  # 475 s together: within the default 480 s budget (provisional)
AUDITED = {"audit_vicuna7b": "vicuna7b", "audit_llama31_8b": "llama31_8b"}  # each in its model config's dtype
SHAPED = ("vicuna7b", "llama31_8b")  # the verify and draft costs: each in its config's dtype
DRAFT_CRITERION = "each depth past the 2nd adds <= 2x the 2nd's cost + 10% T(1) (no growth with depth)"


@dataclass(frozen=True)
class Scale:
    """How big the stages run: the real shapes on CUDA, narrow proxies on a CPU."""

    device: str
    layers: int | None  # None: all
    head_dim: int | None  # None: the real one
    exact_layers: int
    prompts: int
    calibration_prompts: int  # the audits' tolerance measurement, apart from the audited prompts
    prompt_len: int
    new_tokens: int
    max_q: int
    context: int  # the drafting cost's context
    verify_contexts: tuple[int, ...]  # the verify curve's: up to the authors' 2048 (context + q <= 2048)
    reps: int
    budget: dict | None  # EAGLE-2 {total_tokens, depth, top_k}; None: the model config's


def scale_for(device: str) -> Scale:
    if torch.device(device).type == "cuda":
        return Scale(device, None, None, 4, 2, 2, 64, 128, 64, 512, (512, 2048 - 64), 5, None)
    return Scale(device, 2, 8, 2, 2, 1, 16, 32, 8, 32, (32, 64), 2, {"total_tokens": 12, "depth": 3, "top_k": 4})


def decode_pair(target, head, budget: dict, prompt: list[int], new_tokens: int):
    """(plain decoding's output ids, EAGLE-2's GenerationOutput), greedy, no EOS."""
    from eagle2.drafters.plain import PlainDrafter

    plain = generate(target, PlainDrafter(), prompt, SamplingParams(), new_tokens, set()).output_ids
    return plain, generate(target, drafter(head, target, budget), prompt, SamplingParams(), new_tokens, set())


def _drafting(outs) -> dict:
    accepted = sum(r.accepted for out in outs for r in out.rounds)
    drafted = sum(r.tree_size - 1 for out in outs for r in out.rounds)
    rounds = sum(len(out.rounds) for out in outs)
    return {"rounds": rounds, "drafted": drafted, "accepted": accepted,
            "tau": sum(sum(o.accept_lengths) for o in outs) / max(1, rounds), "split_ms": round_split(outs)}


def round_split(outs) -> dict:
    """The mean round in milliseconds: whole, draft (the drafter's propose), verify (the target's tree
    forward and LM head), other (acceptance, cache commit, records)."""
    rounds = [r for out in outs for r in out.rounds]
    n = max(1, len(rounds))
    draft = sum(r.draft_time_s for r in rounds) / n * 1e3
    verify = sum(r.verify_forward_s for r in rounds) / n * 1e3
    whole = sum(r.draft_forward_s + r.verify_forward_s + r.other_s for r in rounds) / n * 1e3
    return {"round": whole, "draft": draft, "verify": verify, "other": whole - draft - verify}


# ---- the stages --------------------------------------------------------------------------------------

def measured_factor(target, reference, scale: Scale, dtype: torch.dtype) -> tuple[float, torch.Tensor]:
    """The audit tolerance factor measured on this model before it judges anything: the gap-error statistic
    of ``experiments.research.numeric_tolerance`` (one-token and teacher-forced logits in ``dtype`` against the fp32
    reference) over calibration prompts apart from the audited ones; (its suggested factor, the ratios)."""
    from eagle2.bench.identity import reference_logits
    from experiments.research.numeric_tolerance import gap_error_ratio, incremental_greedy, suggested_factor

    eps, ratios = torch.finfo(dtype).eps, []
    for i in range(scale.calibration_prompts):
        prompt = gm.planted_prompt(target, scale.prompt_len, seed=400 + i)
        out, one_token = incremental_greedy(target, prompt, scale.new_tokens)
        ref = reference_logits(reference, prompt, out)
        forced = reference_logits(target, prompt, out)
        ratios += [gap_error_ratio(one_token.to(ref.device), ref, eps), gap_error_ratio(forced, ref, eps)]
    ratios = torch.cat(ratios)
    return suggested_factor(ratios), ratios


@contextmanager
def tolerance_in_use(run_dtype: str, factor: float):
    """The identity audit's factor for ``run_dtype`` set to ``factor`` (as measured) inside, restored after."""
    from eagle2.bench import identity

    factors, measured = dict(identity.TOLERANCE_FACTORS), set(identity.MEASURED)
    identity.set_tolerance_factor(run_dtype, factor)
    try:
        yield
    finally:
        identity.TOLERANCE_FACTORS.clear()
        identity.TOLERANCE_FACTORS.update(factors)
        identity.MEASURED.clear()
        identity.MEASURED.update(measured)


def audit(stage: str, scale: Scale, emit) -> None:
    from eagle2.bench.identity import classify, reference_logits
    from eagle2.core.precision import dtype_name

    name = AUDITED[stage]
    dtype = config_dtype(name)
    run_dtype = dtype_name(str(dtype)[6:])
    config = gm.target_config(name, scale.layers, scale.head_dim)
    reference = gm.peaked_target(config, scale.device)
    target = gm.half_copy(reference, dtype)
    factor, ratios = measured_factor(target, reference, scale, dtype)
    head, budget = gm.planted_head(target), eagle2_budget(name, scale)
    counts, outs, shares = {"identical": 0, "numeric": 0, "algorithmic": 0}, [], []
    with tolerance_in_use(run_dtype, factor):  # the audit judges with the factor just measured
        for i in range(scale.prompts):
            prompt = gm.planted_prompt(target, scale.prompt_len, seed=100 + i)
            plain, out = decode_pair(target, head, budget, prompt, scale.new_tokens)
            record = classify(reference_logits(reference, prompt, out.output_ids), out.output_ids, plain, run_dtype)
            counts[record["status"]] += 1
            outs.append(out)
            shares.append(gm.rule_share(target, plain))
    facts = _drafting(outs)
    ok = counts["algorithmic"] == 0 and facts["accepted"] >= 1
    emit({"stage": stage, "case": f"{name} shape, {run_dtype} (its config's), EAGLE-2 {budget}",
          "status": "ok" if ok else "failed", "criterion": "0 algorithmic, >= 1 accepted", "turns": scale.prompts,
          **counts, **facts, "rule_share": statistics.mean(shares), "layers": config.num_hidden_layers,
          "width": config.hidden_size, "dtype": run_dtype, "tolerance_measured": True, "tolerance_factor": factor,
          "tolerance_source": "measured on this model (calibration prompts) before the audit",
          "error_ratio_max": float(ratios.max()), "error_ratio_p99": float(ratios.quantile(0.99))})


def exact_fp32(scale: Scale, emit) -> None:
    name = "vicuna7b"
    config = gm.target_config(name, scale.exact_layers, scale.head_dim)
    target = gm.peaked_target(config, scale.device)
    head, budget = gm.planted_head(target), eagle2_budget(name, scale)
    same, outs = 0, []
    for i in range(scale.prompts):
        prompt = gm.planted_prompt(target, scale.prompt_len, seed=200 + i)
        plain, out = decode_pair(target, head, budget, prompt, scale.new_tokens)
        same += out.output_ids == plain
        outs.append(out)
    facts = _drafting(outs)
    ok = same == scale.prompts and facts["accepted"] >= 1
    emit({"stage": "exact_fp32", "case": f"{name} width, {config.num_hidden_layers} layers, float32",
          "status": "ok" if ok else "failed", "criterion": "identical to plain in every turn, >= 1 accepted",
          "turns": scale.prompts, "identical": same, **facts})


def verify_cost(scale: Scale, emit) -> None:
    from eagle2.heads.shapes import random_llama

    cuda = torch.device(scale.device).type == "cuda"
    for name, dtype in ((n, config_dtype(n)) for n in SHAPED):
        config = gm.target_config(name, scale.layers, scale.head_dim)
        start = device_clock(scale.device)
        target = random_llama(config, device=scale.device, dtype=dtype)
        build_s = device_clock(scale.device) - start
        for context in scale.verify_contexts:
            emit(verify_row(target, name, dtype, context, scale, build_s, cuda))
            build_s = 0.0  # counted once
        del target
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


def verify_row(target, name: str, dtype: torch.dtype, context: int, scale: Scale, build_s: float,
               cuda: bool) -> dict:
    """T(q)/T(1) for q = 1..max_q after ``context`` tokens: wall time, and GPU time on CUDA."""
    from eagle2.bench.cost_profile import measure_verify

    config = target.config
    qs = [q for q in VERIFY_QS if q <= scale.max_q] or [1, scale.max_q]
    curve = measure_verify(target, context=context, max_q=max(qs), reps=scale.reps, timer=sampled(qs, wall_timer))
    wall = [t for t in curve if not math.isnan(t)]
    gpu = None
    if cuda:
        gpu_curve = measure_verify(target, context=context, max_q=max(qs), reps=max(3, scale.reps - 2),
                                   timer=sampled(qs, gpu_timer(curve)))
        gpu = [t for t in gpu_curve if not math.isnan(t)]
    row = {"stage": "verify_cost", "case": f"{name} shape ({config.num_hidden_layers} layers x "
           f"{config.hidden_size}, vocab {config.vocab_size}), {str(dtype)[6:]}, context {context}",
           "context": context, "build_s": build_s, "q": qs, "T1_wall_ms": wall[0] * 1e3,
           "ratio_wall": [t / wall[0] for t in wall]}
    finite = all(math.isfinite(t) and t > 0 for t in wall + (gpu or []))
    if cuda:
        ratio = [t / gpu[0] for t in gpu]
        syncs = timed_section_syncs(target, context, qs, cuda_syncs)
        ok = finite and verify_ok(ratio, gpu, wall, syncs)
        row.update(T1_gpu_ms=gpu[0] * 1e3, ratio_gpu=ratio, timed_syncs=syncs,
                   peak_memory_mb=torch.cuda.max_memory_allocated() / 2**20,
                   criterion=f"GPU-time T({max(qs)})/T(1) <= {VERIFY_RATIO_MAX}, GPU time <= 1.1 x wall, "
                   "0 host syncs in the timed section")
    else:
        ok, row["criterion"] = finite, "positive finite times (the GPU-time criterion needs CUDA)"
    return {**row, "status": "ok" if ok else "failed"}


def draft_cost(scale: Scale, emit) -> None:
    from eagle2.bench.cost_profile import measure_draft

    cuda = torch.device(scale.device).type == "cuda"
    for (name, dtype), build in zip(((n, config_dtype(n)) for n in SHAPED), (gm.planted_head, gm.random_eagle3_head)):
        config = gm.target_config(name, scale.layers, scale.head_dim)
        target = gm.half_copy(gm.peaked_target(config, scale.device), dtype)
        head, budget = build(target), eagle2_budget(name, scale)
        times = measure_draft(target, head, lambda d, h=head, t=target, b=budget: drafter(h, t, {**b, "depth": d}),
                              depth=int(budget["depth"]), context=scale.context, reps=scale.reps)
        steps = [b - a for a, b in zip(times, times[1:])]  # the cost of one more depth
        ok = all(math.isfinite(t) and t > 0 for t in times)
        if cuda:  # a timing criterion needs a quiet device: a shared CPU's timings are noise
            ok = ok and all(s <= 2 * steps[0] + 0.1 * times[0] for s in steps[1:])
        emit({"stage": "draft_cost", "case": f"{type(head).__name__} on {name} shape, {str(dtype)[6:]}, "
              f"top_k {budget['top_k']}", "status": "ok" if ok else "failed",
              "criterion": DRAFT_CRITERION if cuda else "positive finite times (the growth criterion needs CUDA)",
              "draft_ms": [t * 1e3 for t in times]})
        del target, head


SYNC_CASES = (("T=0", SamplingParams()), ("T=1", SamplingParams(temperature=1.0)))  # greedy; stochastic acceptance


def syncs(scale: Scale, emit) -> None:
    name = SHAPED[0]
    dtype, budget = config_dtype(name), eagle2_budget(name, scale)
    limit = 4 * int(budget["depth"]) + 8
    criterion = f"implicit syncs <= {limit} per round (4 per depth + 8; provisional until measured)"
    if torch.device(scale.device).type != "cuda":
        for case, _ in SYNC_CASES:
            emit({"stage": "syncs", "case": f"EAGLE-2 round, {case}", "status": "skipped", "criterion": criterion,
                  "reason": "torch.cuda.set_sync_debug_mode needs CUDA"})
        return
    target = gm.half_copy(gm.peaked_target(gm.target_config(name), scale.device), dtype)
    head = gm.planted_head(target)
    prompt = gm.planted_prompt(target, scale.prompt_len, seed=300)
    for case, params in SYNC_CASES:
        generator = torch.Generator(device=target.device).manual_seed(0)  # as the runner makes it: on the GPU
        generate(target, drafter(head, target, budget), prompt, params, 8, set(), generator)  # warm-up
        out, implicit, explicit, where = count_syncs(
            lambda p=params, g=generator: generate(target, drafter(head, target, budget), prompt, p,
                                                   scale.new_tokens, set(), g))
        rounds = len(out.rounds)
        per_round = implicit / max(1, rounds)
        emit({"stage": "syncs", "case": f"EAGLE-2 round, {case}, {name} shape, {str(dtype)[6:]}, {budget}",
              "status": "ok" if per_round <= limit else "failed", "criterion": criterion, "rounds": rounds,
              "implicit_per_round": per_round, "explicit_per_round": explicit / max(1, rounds),
              "implicit_sites": where[:40], **_drafting([out])})


def run_stage(stage: str, scale: Scale, emit) -> None:
    if stage in AUDITED:
        audit(stage, scale, emit)
    elif stage in RUNNERS:
        RUNNERS[stage](scale, emit)
    else:
        raise ValueError(f"unknown stage {stage!r}; choose from {', '.join(STAGES)}")


RUNNERS = {"exact_fp32": exact_fp32, "verify_cost": verify_cost, "draft_cost": draft_cost, "syncs": syncs,
           "cuda_graphs": cuda_graphs}


def row_writer(path: Path | None, rows: list[dict]):
    """``emit(row)``: append, print one line, and rewrite ``path`` (atomically) with every row so far."""

    def emit(row: dict) -> None:
        rows.append(row)
        print(f"[gpu-check] {row['stage']} | {row['case']} | {row['status']}", flush=True)
        if path is not None:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(rows, indent=1, default=str))
            os.replace(tmp, path)

    return emit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.ops.gpu_check.stages", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=STAGES)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", type=Path, required=True, help="JSON list of the rows, rewritten after each")
    args = ap.parse_args(argv)
    rows: list[dict] = []
    with torch.no_grad():
        run_stage(args.stage, scale_for(args.device), row_writer(args.rows, rows))
    return 0 if all(r["status"] != "failed" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
