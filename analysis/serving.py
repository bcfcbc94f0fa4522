"""The serving benchmark's report (``experiment=serving``), from stored rows only:

    python -m analysis.serving results/serving --out report/serving [--ttft 10 --tpot 0.5]

Per method (EAGLE-2 with the policy and with ``method.policy=always`` apart) and rate: throughput, requests per
second, p50/p90/p99 of TTFT, TPOT and end-to-end latency, and goodput under the latency objective
(``serving.md``); and latency (p50 and p90 end-to-end) against throughput, one line per method
(``serving.png``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from eagle2.results.frames import load_rows
from eagle2.results.serving_stats import Timing, summarize


def label(row) -> str:
    config = row["method_config"] or {}
    policy = config.get("policy")
    return row["method"] + (f" [policy={policy}]" if policy else "")


def rate_table(rows: pd.DataFrame, slo: dict[str, float]) -> pd.DataFrame:
    """One line per (method, rate fraction): ``eagle2.results.serving_stats.summarize`` of its requests."""
    served = rows[rows["serving"].notna()] if "serving" in rows else rows.iloc[0:0]
    lines = []
    for (name, fraction), group in served.groupby([served.apply(label, axis=1),
                                                   served["serving"].map(lambda s: s["rate_fraction"])]):
        timings = [Timing(s["arrival_s"], s["admitted_s"], s["first_token_s"], s["finished_s"], int(n))
                   for s, n in zip(group["serving"], group["new_tokens"])]
        lines.append({"method": name, "rate_fraction": fraction,
                      "rate_rps": group["serving"].iloc[0]["rate_rps"], **summarize(timings, slo)})
    return pd.DataFrame(lines)


def plot(table: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, group in table.sort_values("rate_fraction").groupby("method"):
        line, = ax.plot(group["throughput_tokens_per_s"], group["e2e_p50_s"], marker="o", label=f"{name} p50")
        ax.plot(group["throughput_tokens_per_s"], group["e2e_p90_s"], marker="x", ls="--", color=line.get_color(),
                label=f"{name} p90")
    ax.set_xlabel("throughput (output tokens/s)")
    ax.set_ylabel("end-to-end latency (s)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ttft", type=float, default=10.0, help="the objective's time to first token (s)")
    parser.add_argument("--tpot", type=float, default=0.5, help="the objective's time per output token (s)")
    args = parser.parse_args(argv)
    table = rate_table(load_rows(args.results), {"ttft_s": args.ttft, "tpot_s": args.tpot})
    if table.empty:
        print(f"no serving rows under {args.results}")
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    columns = ["method", "rate_fraction", "rate_rps", "requests", "throughput_tokens_per_s", "requests_per_s",
               *(f"{m}_p{p}_s" for m in ("ttft", "tpot", "e2e") for p in (50, 90, 99)), "goodput_requests_per_s"]
    text = (f"# Serving: latency against load\n\nObjective: TTFT <= {args.ttft} s, TPOT <= {args.tpot} s.\n\n"
            + table.sort_values(["method", "rate_fraction"])[columns].to_markdown(index=False, floatfmt=".3g") + "\n")
    (args.out / "serving.md").write_text(text)
    plot(table, args.out / "serving.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
