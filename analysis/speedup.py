"""One line per config of a results folder: tokens/s, speedup over matched plain decoding, tau.

``python -m analysis.speedup RESULTS [--dataset D] [--model M]`` (what ``make demo`` prints after
running plain decoding and EAGLE-2 on the same questions). Speedup is computed as in the report
(``analysis.metrics``): tokens/s over plain decoding's on the same question turns, same model,
dataset, temperature, dtype, seed and max_new_tokens; "no baseline" when there is none, with the plain
rows it lacks named.
"""

from __future__ import annotations

import argparse
import sys

from analysis.metrics import load_rows, method_table, missing_baseline


def speedup_lines(results: str, dataset: str | None = None, model: str | None = None) -> list[str]:
    rows = load_rows(results)
    if rows.empty:
        return [f"no finished rows under {results}"]
    for key, value in (("dataset", dataset), ("model", model)):
        if value:
            rows = rows[rows[key] == value]
    lines = []
    for r in method_table(rows).itertuples():
        speed = f"{r.speedup:.2f}x over plain" if r.speedup == r.speedup else \
            f"no baseline ({missing_baseline(rows, rows[rows.config_hash == r.config_hash])})"
        lines.append(f"{r.model}/{r.dataset}/{r.method} {r.dtype} T={r.temperature:g} ({r.config_hash}): "
                     f"{r.turns} turns, "
                     f"{r.tokens_per_s:.2f} tokens/s, {speed} ({r.baseline_turns} shared turns), tau {r.tau:.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.speedup", description=__doc__)
    ap.add_argument("results")
    ap.add_argument("--dataset")
    ap.add_argument("--model")
    args = ap.parse_args(argv)
    print("\n".join(speedup_lines(args.results, args.dataset, args.model)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
