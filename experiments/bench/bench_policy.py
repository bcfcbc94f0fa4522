"""EAGLE-2 with the round policy (``method.policy=pays``) against plain decoding, eager and compiled, and EAGLE-2
drafting every round (``method.policy=always``), at batch sizes 1..16, side by side:

    python -m experiments.bench.bench_policy [--dataset mt_bench] [--limit 5] [--tokens 128] [--batch 1,2,4,8,16]
    python -m experiments.bench.bench_policy --print-only      # the table from rows already stored

Each cell is one ``run.py`` config (rows under ``results/bench_policy``, finished ones never rerun); the table
divides each method's batch throughput (all new tokens over the batch's wall span; at batch 1 the decode rate)
by eager plain's and by the faster plain at the same batch size. Extra overrides (``-- model.dtype=float32``)
go to every run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from eagle2.results.frames import load_rows
from eagle2.results.throughput import batch_throughput

RESULTS = "results/bench_policy"
CELLS = {"plain eager": ["method=plain", "engine.compile=false"],
         "plain compiled": ["method=plain", "engine.compile=true"],
         "eagle2 always": ["method=eagle2", "method.policy=always"],
         "eagle2 pays": ["method=eagle2", "method.policy=pays"]}


def run_cells(args, extra: list[str]) -> None:
    for overrides in CELLS.values():
        subprocess.run([sys.executable, "run.py", "-m", *overrides, f"dataset={args.dataset}",
                        f"dataset.limit={args.limit}", f"max_new_tokens={args.tokens}", f"batch_size={args.batch}",
                        f"paths.results={RESULTS}", "logger=none", *extra], check=True)


def rates() -> dict[tuple[str, int], float]:
    rows, out = load_rows(RESULTS), {}
    for (method, policy, compiled, b), group in rows.groupby(
            [rows.method, rows.method_config.map(lambda c: c.get("policy", "always")),
             rows.compile.str.endswith("true"), rows.batch_size]):
        name = f"plain {'compiled' if compiled else 'eager'}" if method == "plain" else f"{method} {policy}"
        out[name, int(b)] = (batch_throughput(group.to_dict("records"))["throughput_tokens_per_s"] if b > 1
                             else group.new_tokens.sum() / group.wall_time_s.sum())
    return out


def table(r: dict[tuple[str, int], float]) -> str:
    lines = ["| B | " + " | ".join(f"{n} tok/s" for n in CELLS) + " | eagle2 pays / eager plain | "
             "eagle2 pays / fastest plain | eagle2 always / fastest plain |",
             "|" + "---|" * (len(CELLS) + 4)]
    for b in sorted({b for _, b in r}):
        fastest = max(r.get(("plain eager", b), 0.0), r.get(("plain compiled", b), 0.0)) or float("nan")
        eager = r.get(("plain eager", b), float("nan"))
        cells = [f"{r.get((n, b), float('nan')):.1f}" for n in CELLS]
        pays, always = r.get(("eagle2 pays", b), float("nan")), r.get(("eagle2 always", b), float("nan"))
        lines.append(f"| {b} | " + " | ".join(cells) + f" | {pays / eager:.2f}x | {pays / fastest:.2f}x | "
                     f"{always / fastest:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mt_bench")
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--batch", default="1,2,4,8,16")
    parser.add_argument("--print-only", action="store_true")
    args, extra = parser.parse_known_args(argv)
    if not args.print_only:
        run_cells(args, [e for e in extra if e != "--"])
    print(table(rates()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
