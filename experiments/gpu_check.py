"""``make gpu-check``: is a fresh GPU machine ready for the paper's runs? One command, no hub, ~8 minutes
on one GPU; prints one summary table and writes it as JSON (``--out``, default
``results/gpu_check/gpu_check.json``).

Three stages, each a group of rows:

1. ``tests``: the CUDA-capable tests (``pytest -m gpu``): greedy identity of every method with tiny
   random models, and the chi-square certification of EAGLE-2 at T=1, in fp16 and bf16 on the GPU
   (``pytest -m gpu`` alone certifies every method, ~10 more minutes);
2. ``smollm2``: ``model=smollm2`` plain / sps / eagle / eagle2 on CUDA in bf16 on MT-bench, with tokens/s,
   speedup over plain, tau and peak GPU memory per method, then the identity audit
   (``python -m eagle2.identity``) of their greedy outputs against plain decoding's;
3. ``verify_cost``: the target's verify cost T(q)/T(1) for q = 1..64 tree tokens (one forward after a
   512-token context, the engine's own masked tree forward, median of 5) for random-weight Llama models
   with Vicuna-7B's and LLaMA-3-8B's exact shapes in fp16 (``eagle2.heads.shapes``; weights random, built on
   the GPU in seconds).

Without a CUDA device it says so in one line and runs the CPU half: stage 1's greedy identity cases in
fp16/bf16 on the CPU, stage 2 on the CPU in fp32 with a fixed 8-node EAGLE-2 budget (1 question, 16
new tokens), stage 3 with narrow 2-layer proxies of the two shapes (q = 1..16). It exits 0 unless a
check failed (a test, an algorithmic divergence, a stage that raised).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle2.core.engine import device_clock

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("plain", "sps", "eagle", "eagle2")
SHAPES = ("vicuna7b", "llama3_8b")  # verify-cost models: Vicuna-7B's and LLaMA-3-8B's exact shapes
SHOWN_Q = (2, 9, 17, 33, 60, 64)  # T(q)/T(1) columns in the printed table (60: the authors' total_token)


@dataclass(frozen=True)
class Plan:
    """What one run checks: on CUDA the full check, on a CPU the small half."""

    device: str
    test_args: tuple[str, ...]  # pytest selection of the gpu-marked tests
    test_env: dict
    questions: int
    new_tokens: int
    smollm2: tuple[str, ...]  # SmolLM2 overrides: dtype (and the CPU's fixed budget)
    shape_layers: int | None  # None: all layers
    shape_width: int | None  # per attention head (None: the real width)
    max_q: int
    context: int
    dtype: str  # the verify-cost models' dtype


def plan_for(cuda: bool) -> Plan:
    tests = ("tests/test_greedy.py", "tests/test_certification.py")
    if cuda:
        # every greedy identity case; chi-square for EAGLE-2 at T=1 (2,500 samples take ~1 min per case even on a
        # GPU: the tiny models are bound by Python, not the device); `pytest -m gpu` runs every method
        chi_square = "not test_method_matches_target_distribution or (T1 and eagle2 and not auto)"
        return Plan("cuda", (*tests, "-k", chi_square), {}, 5, 128, ("model.dtype=bfloat16",), None, None, 64, 512,
                    "float16")
    # CPU half: fp32 (bf16 is several times slower on CPUs without native bf16) and SmolLM2's fixed CPU
    # budget of 8 nodes (no cost-profile measurement)
    greedy = "speculative_equals_plain_on_tiny and random and (sps or eagle2) and not auto"
    return Plan("cpu", ("tests/test_greedy.py", "-k", greedy),
                {"EAGLE2_GPU_TEST_DEVICE": "cpu"}, 1, 16, ("model.dtype=float32", "model.eagle2.total_tokens=8"),
                2, 8, 16, 128, "float32")


# ---- stage 1: the CUDA-capable tests -----------------------------------------------------------------

def run_tests(plan: Plan, timeout_s: float) -> list[dict]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *plan.test_args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", **plan.test_env}
    start = device_clock("cpu")  # a subprocess: nothing queued on this process's device
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        text, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout or ""
        text, code = partial.decode() if isinstance(partial, bytes) else partial, None
    last = text.strip().splitlines()[-1] if text.strip() else ""
    counts = {k.rstrip("s") if k.startswith("error") else k: int(n)
              for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", last)}
    status = "timeout" if code is None else ("ok" if code == 0 and counts.get("passed") else "failed")
    if status != "ok":
        print(text[-3000:], file=sys.stderr)
    what = "greedy identity + EAGLE-2 chi-square T=1" if plan.device == "cuda" else "greedy identity (on CPU)"
    return [{"stage": "tests", "case": f"{what}, fp16 and bf16", "status": status,
             "wall_s": device_clock("cpu") - start,
             **counts, "command": " ".join(cmd[1:])}]


# ---- stage 2: SmolLM2, four methods, and the identity audit ------------------------------------------

def compose(*overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides))


def run_smollm2(plan: Plan, results: Path, threads: int | None) -> list[dict]:
    from eagle2.bench.runner import run

    common = ["model=smollm2", f"model.device={plan.device}", *plan.smollm2, "dataset=mt_bench",
              f"dataset.limit={plan.questions}", f"max_new_tokens={plan.new_tokens}", f"paths.results={results}",
              "logger=none", *([f"threads={threads}"] if threads else [])]
    rows = []
    for method in METHODS:
        start = device_clock(plan.device)
        summary = run(compose(f"method={method}", *common))
        rows.append({"stage": "smollm2", "case": method, "status": "ok", "wall_s": device_clock(plan.device) - start,
                     "tokens_per_s": summary["tokens_per_s"], "tau": summary["tau"], "turns": summary["turns"],
                     "peak_memory_mb": _peak_memory(results, method)})
    plain = rows[0]["tokens_per_s"]
    for row in rows:
        row["speedup"] = row["tokens_per_s"] / plain if plain and row["tokens_per_s"] else None
    return rows + [audit(results, plan.device)]


def _peak_memory(results: Path, method: str) -> float | None:
    from eagle2.bench.results import read_rows

    peaks = [r.get("peak_memory_mb") for path in results.rglob(f"{method}-*.jsonl") for r in read_rows(path)]
    peaks = [p for p in peaks if p is not None]
    return max(peaks) if peaks else None


def audit(results: Path, device: str) -> dict:
    """``python -m eagle2.identity RESULTS`` (reference target on the same device), summarised."""
    from analysis.identity import load_audit_records
    from eagle2.bench.identity import main as identity_main

    code = identity_main([str(results), "--override", f"model.device={device}"])
    counts: dict[str, dict[str, int]] = {}
    for r in load_audit_records(str(results)):
        by = counts.setdefault(r["method"], {"identical": 0, "numeric": 0, "algorithmic": 0})
        by[r["status"]] += 1
    return {"stage": "smollm2", "case": "identity audit", "status": "ok" if code == 0 else "failed",
            "by_method": counts}


# ---- stage 3: verify cost at the real shapes ---------------------------------------------------------

def verify_cost(plan: Plan, name: str) -> dict:
    from eagle2.core.precision import resolve_dtype
    from eagle2.drafters.cost_profile import measure_verify
    from eagle2.heads.shapes import PUBLISHED, llama_config, random_llama

    width = plan.shape_width and plan.shape_width * PUBLISHED[name]["num_attention_heads"]
    config = llama_config(name, layers=plan.shape_layers, width=width)
    if plan.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = device_clock(plan.device)
    target = random_llama(config, device=plan.device, dtype=resolve_dtype(plan.dtype))
    built_s = device_clock(plan.device) - start
    times = measure_verify(target, context=plan.context, max_q=plan.max_q, reps=5)
    peak = torch.cuda.max_memory_allocated() / 2**20 if plan.device == "cuda" else None
    del target
    if plan.device == "cuda":
        torch.cuda.empty_cache()
    shape = f"{config.num_hidden_layers} layers x {config.hidden_size}, {config.num_attention_heads}/" \
            f"{config.num_key_value_heads} heads, vocab {config.vocab_size}"
    return {"stage": "verify_cost", "case": f"{name} shape ({shape})", "status": "ok", "dtype": plan.dtype,
            "context": plan.context, "build_s": built_s, "T1_ms": times[0] * 1e3,
            "ratio": [t / times[0] for t in times], "peak_memory_mb": peak}


# ---- the summary -----------------------------------------------------------------------------------

def result_text(row: dict) -> str:
    if row["stage"] == "tests":
        return ", ".join(f"{row.get(k, 0)} {k}" for k in ("passed", "failed", "skipped")) + f" ({row['wall_s']:.0f} s)"
    if row["stage"] == "smollm2" and "by_method" in row:
        return "; ".join(f"{m}: {c['identical']} identical, {c['numeric']} numeric, {c['algorithmic']} algorithmic"
                         for m, c in row["by_method"].items()) or "no greedy speculative turns"
    if row["stage"] == "smollm2":
        mem = f", peak {row['peak_memory_mb']:.0f} MB" if row.get("peak_memory_mb") else ""
        return f"{row['tokens_per_s']:.1f} tok/s, speedup {row['speedup']:.2f}, tau {row['tau']:.2f}{mem}"
    if row["stage"] == "verify_cost":
        ratios = " ".join(f"T({q})/T(1)={row['ratio'][q - 1]:.2f}" for q in SHOWN_Q if q <= len(row["ratio"]))
        mem = f", peak {row['peak_memory_mb']:.0f} MB" if row.get("peak_memory_mb") else ""
        return f"T(1)={row['T1_ms']:.1f} ms {ratios}{mem}"
    return row.get("error", "")


def print_table(rows: list[dict]) -> None:
    print("| stage | case | status | result |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['stage']} | {row['case']} | {row['status']} | {result_text(row)} |")


def guarded(stage: str, case: str, fn, *args) -> list[dict]:
    """The stage's rows, or one failed row naming the error (the other stages still run)."""
    try:
        out = fn(*args)
        return out if isinstance(out, list) else [out]
    except Exception as exc:  # noqa: BLE001 - reported as a failed row
        import traceback

        traceback.print_exc()
        return [{"stage": stage, "case": case, "status": "failed", "error": f"{type(exc).__name__}: {exc}"}]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/gpu_check", help="folder for gpu_check.json and the SmolLM2 rows")
    ap.add_argument("--threads", type=int, default=None, help="torch threads on a CPU (default: torch's)")
    ap.add_argument("--tests-timeout", type=float, default=600.0, help="seconds for stage 1 before it counts as failed")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_MODE", "offline")
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    if not cuda:
        print("[gpu-check] no CUDA device on this machine: running the CPU half only", flush=True)
    plan, out = plan_for(cuda), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = device_clock(plan.device)
    rows = guarded("tests", "pytest -m gpu", run_tests, plan, args.tests_timeout)
    rows += guarded("smollm2", "four methods", run_smollm2, plan, out / "smollm2", args.threads)
    for name in SHAPES:
        rows += guarded("verify_cost", name, verify_cost, plan, name)
    report = {"device": torch.cuda.get_device_name() if cuda else "cpu", "cuda": cuda, "torch": torch.__version__,
              "wall_s": device_clock(plan.device) - start, "rows": rows}
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"\n[gpu-check] {report['device']}, {report['wall_s']:.0f} s; written to {out / 'gpu_check.json'}")
    print_table(rows)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
