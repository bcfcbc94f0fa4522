"""The speedup-versus-batch curve on this machine, one run (``make bench-batch``): plain, SpS, EAGLE-2,
EAGLE-3 and PLD at batch sizes 1, 2, 4, 8 on MT-bench first turns, through ``run.py``'s own runner
(``eagle2.bench.runner.run``: batch 1 is the batch-1 engine, B > 1 ``eagle2.core.batch_engine``).

For each B the methods run back to back (plain first), so a comparison at one B sees the same machine load.
Prints one table, throughput in tokens/s (all new tokens over the batch's wall span, prefill included) with
the speedup over plain at the same B beside it, then batched plain's B-over-B=1 throughput ratio against the
4x goal at B=8 and the measured limit: the cost of one target forward over B rows of one token against one
row (``eagle2.bench.cost_profile.measure_verify``). Writes the rows, ``batch_scaling.csv`` / ``.md`` and
the figure (``analysis.batch_scaling``) into ``--results``, and copies the PNG to ``--figure``.

``--per-row`` also runs every drafting method at each B > 1 with ``batch_drafting=false`` (each row drafts alone,
the path before batched drafting) right after its batched run, into ``<results>-per_row`` (beside, not under:
the scaling table reads ``--results`` recursively), and prints both
throughputs side by side with the speedup over plain at that B.

    python -m experiments.bench.bench_batch --limit 8 --max-new-tokens 32 --threads 1
    python -m experiments.bench.bench_batch --limit 4 --max-new-tokens 32 --methods plain,eagle2 --per-row
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import pandas as pd
import torch

from analysis.batch_scaling import scaling_figure, scaling_markdown, scaling_table
from analysis.metrics import load_rows
from analysis.results_page import git_commit
from eagle2.bench.cost_profile import measure_verify
from eagle2.bench.models import load_target
from eagle2.bench.runner import run
from eagle2.core.cpu import cpu_kind
from eagle2.core.precision import concrete_dtype
from eagle2.prompts.questions import PROJECT_ROOT, benchmark_file, load_questions
from experiments.bench.side_by_side import run_config


def first_turns(limit: int, path: Path) -> Path:
    """The first ``limit`` MT-bench questions with their first turn only (one request per question)."""
    questions = load_questions(benchmark_file("mt_bench"), limit)
    path.write_text("".join(json.dumps({**q, "turns": q["turns"][:1]}) + "\n" for q in questions))
    return path


def cell_config(args, method: str, batch_size: int, questions: Path, results: Path, method_overrides: bool = True):
    """One cell's config; ``method_overrides`` false leaves out the ``method.*`` overrides (the forward-cost
    measurement composes plain, which has not every method's keys)."""
    overrides = [o for o in args.overrides if method_overrides or not o.lstrip("+~").startswith("method.")]
    return run_config(
        "logger=none", "dataset=mt_bench", f"dataset.path={questions}", f"dataset.limit={args.limit}",
        f"max_new_tokens={args.max_new_tokens}", f"threads={args.threads}", f"warmup_tokens={args.warmup}",
        f"method={method}", f"batch_size={batch_size}", f"paths.results={results}", *overrides)


def per_row_results(results: Path) -> Path:
    """Where ``--per-row`` cells go: beside ``results``, never under it (its tables read it recursively)."""
    return results.with_name(results.name + "-per_row")


def per_row_lines(table: pd.DataFrame, per_row: pd.DataFrame) -> str:
    """Markdown: per drafting method and B > 1, throughput with batched and with per-row drafting, each with its
    speedup over plain at that B (plain from the batched run: plain drafts nothing)."""
    plain = table[table.method == "plain"].set_index("batch_size").throughput
    alone = per_row.set_index(["method", "batch_size"]).throughput
    lines = ["| method | B | batched drafting, tokens/s | per-row drafting, tokens/s | batched / per-row |",
             "|---|---:|---:|---:|---:|"]
    for r in table[(table.method != "plain") & (table.batch_size > 1)].itertuples():
        other = alone.get((r.method, r.batch_size), float("nan"))
        base = plain.get(r.batch_size, float("nan"))
        lines.append(f"| {r.method} | {r.batch_size} | {r.throughput:.2f} ({r.throughput / base:.2f}x plain) | "
                     f"{other:.2f} ({other / base:.2f}x plain) | {r.throughput / other:.2f}x |")
    return "\n".join(lines) + "\n"


def forward_cost_ratio(cfg, batch_size: int, context: int = 128, reps: int = 10) -> float:
    """One target forward (+ LM head) over ``batch_size`` rows of one token after ``context`` tokens, over
    the same for one row: the most batched plain decoding can gain is ``batch_size`` / this."""
    cfg.model.dtype = concrete_dtype(cfg.model.dtype, cfg.model.device)
    target, _ = load_target(cfg.model)
    one = measure_verify(target, context=context, max_q=1, reps=reps)[0]
    return measure_verify(target, context=context, max_q=1, reps=reps, rows=batch_size)[0] / one


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=8, help="MT-bench questions (first turns)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-sizes", default="1,2,4,8")
    ap.add_argument("--methods", default="plain,sps,eagle2,eagle3,pld")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=16, help="warm-up tokens before each cell (untimed)")
    ap.add_argument("--results", default=None, help="default: results/bench_batch/<UTC time>")
    ap.add_argument("--figure", default="docs/figures/batch_scaling.png", help="where the PNG is copied ('' = not)")
    ap.add_argument("--per-row", action="store_true", help="also run each drafting method with batch_drafting=false")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every cell, e.g. model.dtype=bfloat16")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = Path(args.results or f"results/bench_batch/{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    results.mkdir(parents=True, exist_ok=True)
    commit = git_commit(PROJECT_ROOT)  # before the figure is written (a rewritten figure dirties the checkout)
    questions = first_turns(args.limit, results / "mt_bench_first_turns.jsonl")
    sizes, methods = [int(b) for b in args.batch_sizes.split(",")], args.methods.split(",")
    started = time.time()
    for batch_size in sizes:  # every method at one B back to back: one comparison, one machine load
        for method in methods:
            run(cell_config(args, method, batch_size, questions, results))
            if args.per_row and batch_size > 1 and method != "plain":  # the same B, the same load, right after
                cfg = cell_config(args, method, batch_size, questions, per_row_results(results))
                cfg.batch_drafting = False
                run(cfg)
    minutes = (time.time() - started) / 60
    table = scaling_table(load_rows(results))
    table.to_csv(results / "batch_scaling.csv", index=False)
    text = scaling_markdown(table)
    (results / "batch_scaling.md").write_text(text)
    stamped = (f"commit {commit}, {time.strftime('%Y-%m-%d', time.gmtime())}, CPU kind {cpu_kind()}, "
               f"{args.threads} thread(s), {args.limit} MT-bench first turns x {args.max_new_tokens} tokens")
    pngs = [p for p in scaling_figure(table, results, stamped=stamped) if p.suffix == ".png"]
    if args.figure and pngs:
        shutil.copyfile(pngs[0], args.figure)
    top = max(sizes)
    ratio = forward_cost_ratio(cell_config(args, "plain", 1, questions, results, method_overrides=False), top)
    plain = table[table.method == "plain"].set_index("batch_size").throughput
    print(f"\n## Batched decoding on {cpu_kind()} ({torch.get_num_threads()} thread(s)), SmolLM2, "
          f"{args.limit} MT-bench first turns, {args.max_new_tokens} new tokens, {minutes:.1f} min\n")
    print(text)
    if args.per_row:
        print("Batched against per-row drafting (the same cells, run back to back):\n")
        print(per_row_lines(table, scaling_table(load_rows(per_row_results(results)))))
    if 1 in plain and top in plain:
        gain = plain[top] / plain[1]
        print(f"Batched plain throughput B={top} / B=1: {gain:.2f}x (goal >= 4x: {'met' if gain >= 4 else 'missed'}); "
              f"one target forward over {top} rows costs {ratio:.2f}x one over 1 row: the forward cost alone predicts "
              f"{top / ratio:.2f}x for batched plain (decode only, one context length; the measured ratio also "
              "carries prefill and the shared machine's load at each cell's time).")
    print(f"\nrows, batch_scaling.csv/.md and the figure: {results}" + (f"; PNG copied to {args.figure}"
                                                                          if args.figure else ""))
    return 0


if __name__ == "__main__":
    pd.set_option("display.width", 160)
    raise SystemExit(main())
