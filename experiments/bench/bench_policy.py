"""EAGLE-2 with the round policy (``method.policy=pays``) against plain decoding, eager and compiled, and EAGLE-2
drafting every round (``method.policy=always``), each eager and compiled, at batch sizes 1..16, side by side:

    python -m experiments.bench.bench_policy [--dataset mt_bench] [--limit 5] [--tokens 128] [--batch 1,2,4,8,16]
    python -m experiments.bench.bench_policy --reps 2 --cells "plain,pays"   # two repetitions, four cells
    python -m experiments.bench.bench_policy --print-only      # the table from rows already stored

Each cell is one ``run.py`` config (rows under ``results/bench_policy``, finished ones never rerun); the table
divides each method's batch throughput (all new tokens over the batch's wall span; at batch 1 the decode rate)
by eager plain's and by the faster plain at the same batch size. With ``--reps N`` each repetition writes its own
folder (``rep1``, ``rep2``, ...), the cells run in the opposite order in every other repetition (a drift of the
machine's speed then falls on both sides of a ratio), and the table shows each cell's median. ``--cells`` keeps
the cells whose name contains one of its comma-separated words. Extra overrides (``-- model.dtype=float32``) go to
every run. Every turn decodes ``--tokens`` tokens (``ignore_eos=true``; ``--stop-at-eos`` stops at the stop
tokens): in half precision a near-tie can end one method's turn early, and a batch's span is set by its longest
turns, so unequal lengths would count against the method that wrote fewer tokens.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
from pathlib import Path

from eagle2.results.frames import load_rows
from eagle2.results.throughput import batch_throughput

RESULTS = "results/bench_policy"
CELLS = {"plain eager": ["method=plain", "engine.compile=false"],
         "plain compiled": ["method=plain", "engine.compile=true"],
         "eagle2 always eager": ["method=eagle2", "method.policy=always", "engine.compile=false"],
         "eagle2 pays eager": ["method=eagle2", "method.policy=pays", "engine.compile=false"],
         "eagle2 always compiled": ["method=eagle2", "method.policy=always", "engine.compile=true"],
         "eagle2 pays compiled": ["method=eagle2", "method.policy=pays", "engine.compile=true"]}
SPECULATIVE = [name for name in CELLS if not name.startswith("plain")]


def chosen_cells(words: str | None) -> list[str]:
    """The cells whose name contains one of the comma-separated ``words`` (all of them when None)."""
    picked = [n for n in CELLS if words is None or any(w.strip() in n for w in words.split(","))]
    if not picked:
        raise SystemExit(f"--cells {words!r} names none of: {', '.join(CELLS)}")
    return picked


def rep_folders(results: str, reps: int) -> list[str]:
    return [results] if reps <= 1 else [str(Path(results) / f"rep{i}") for i in range(1, reps + 1)]


def run_cells(args, extra: list[str]) -> None:
    names = chosen_cells(args.cells)
    for i, folder in enumerate(rep_folders(args.results, args.reps)):
        for name in names if i % 2 == 0 else names[::-1]:
            subprocess.run([sys.executable, "run.py", "-m", *CELLS[name], f"dataset={args.dataset}",
                            f"dataset.limit={args.limit}", f"max_new_tokens={args.tokens}",
                            f"batch_size={args.batch}", f"paths.results={folder}", "logger=none",
                            f"ignore_eos={str(not args.stop_at_eos).lower()}", *extra], check=True)


def median_rates(results: str) -> dict[tuple[str, int], float]:
    """Each cell's median over the repetition folders (``rep*``) of ``results``, or its rate in ``results``."""
    folders = sorted(p for p in Path(results).glob("rep*") if p.is_dir()) or [Path(results)]
    every = [rates(str(f)) for f in folders]
    return {key: statistics.median(r[key] for r in every if key in r) for key in set().union(*every)}


def rates(results: str) -> dict[tuple[str, int], float]:
    rows, out = load_rows(results), {}
    if rows.empty:
        return out
    for (method, policy, compiled, b), group in rows.groupby(
            [rows.method, rows.method_config.map(lambda c: c.get("policy", "always")),
             rows.compile.str.endswith("true"), rows.batch_size]):
        state = "compiled" if compiled else "eager"
        name = f"plain {state}" if method == "plain" else f"{method} {policy} {state}"
        out[name, int(b)] = (batch_throughput(group.to_dict("records"))["throughput_tokens_per_s"] if b > 1
                             else group.new_tokens.sum() / group.wall_time_s.sum())
    return out


def shown(value: float, form: str) -> str:
    return "-" if math.isnan(value) else form.format(value)


def table(r: dict[tuple[str, int], float]) -> str:
    """Tokens/s of every cell, then each speculative cell over eager plain and over the fastest plain."""
    lines = ["| B | " + " | ".join(f"{n} tok/s" for n in CELLS) + " | "
             + " | ".join(f"{n} / eager plain | {n} / fastest plain" for n in SPECULATIVE) + " |",
             "|" + "---|" * (1 + len(CELLS) + 2 * len(SPECULATIVE))]
    nan = float("nan")
    for b in sorted({b for _, b in r}):
        fastest = max(r.get(("plain eager", b), 0.0), r.get(("plain compiled", b), 0.0)) or nan
        eager = r.get(("plain eager", b), nan)
        cells = [shown(r.get((n, b), nan), "{:.1f}") for n in CELLS]
        ratios = [shown(r.get((n, b), nan) / base, "{:.2f}x") for n in SPECULATIVE for base in (eager, fastest)]
        lines.append(f"| {b} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mt_bench")
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--batch", default="1,2,4,8,16")
    parser.add_argument("--results", default=RESULTS, help="where the cells' rows go (a fresh folder: a new run)")
    parser.add_argument("--reps", type=int, default=1, help="repetitions, each in its own folder (medians shown)")
    parser.add_argument("--cells", default=None, help="comma-separated words: run the cells whose name has one")
    parser.add_argument("--stop-at-eos", action="store_true", help="turns end at their stop tokens (unequal lengths)")
    parser.add_argument("--print-only", action="store_true")
    args, extra = parser.parse_known_args(argv)
    if not args.print_only:
        run_cells(args, [e for e in extra if e != "--"])
    found = median_rates(args.results)
    if not found:
        raise SystemExit(f"no rows under {args.results} (run the cells first: without --print-only)")
    print(table(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
