"""The serving benchmark's report (``experiment=serving``), from stored rows only:

    python -m analysis.serving results/serving --out report/serving [--ttft 10 --tpot 0.5]
    python -m analysis.serving results/serving --page docs/results/serving/<cpu-kind>.md

Per method (EAGLE-2 with the policy and with ``method.policy=always`` apart) and rate: throughput, requests per
second, p50/p90/p99 of TTFT, TPOT and end-to-end latency, and goodput under the latency objective
(``serving.md``); and latency (p50 and p90 end-to-end) against throughput, one line per method
(``serving.png``). ``--page`` writes the same table and figure as a stamped results page (commit, date, machine,
the rows' command), with each speculative method against plain decoding per rate (``against_plain``).
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


def against_plain(table: pd.DataFrame) -> pd.DataFrame:
    """Per speculative method and rate: its p50 end-to-end latency, throughput and goodput over plain decoding's
    at the same rate (a latency ratio below 1 and throughput / goodput ratios of 1 or more favour it)."""
    plain = table[table["method"] == "plain"].set_index("rate_fraction")
    lines = []
    for _, row in table[table["method"] != "plain"].iterrows():
        if row["rate_fraction"] not in plain.index:
            continue
        base = plain.loc[row["rate_fraction"]]
        lines.append({"method": row["method"], "rate_fraction": row["rate_fraction"],
                      "e2e_p50 / plain": row["e2e_p50_s"] / base["e2e_p50_s"],
                      "throughput / plain": row["throughput_tokens_per_s"] / base["throughput_tokens_per_s"],
                      "goodput / plain": (row["goodput_requests_per_s"] / base["goodput_requests_per_s"]
                                          if base["goodput_requests_per_s"] else float("nan"))})
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


COLUMNS = ["method", "rate_fraction", "rate_rps", "requests", "throughput_tokens_per_s", "requests_per_s",
           *(f"{m}_p{p}_s" for m in ("ttft", "tpot", "e2e") for p in (50, 90, 99)), "goodput_requests_per_s"]


def report_text(table: pd.DataFrame, ttft: float, tpot: float) -> str:
    text = (f"Objective: TTFT <= {ttft} s, TPOT <= {tpot} s.\n\n"
            + table.sort_values(["method", "rate_fraction"])[COLUMNS].to_markdown(index=False, floatfmt=".3g") + "\n")
    ratios = against_plain(table)
    if not ratios.empty:
        text += ("\nEach speculative method against plain decoding at the same arrival rate:\n\n"
                 + ratios.sort_values(["method", "rate_fraction"]).to_markdown(index=False, floatfmt=".3g") + "\n")
    return text


def write_page(table: pd.DataFrame, rows: pd.DataFrame, page: Path, ttft: float, tpot: float) -> None:
    """``page`` (markdown) and its figure beside it (same stem, .png), stamped as every results page is."""
    from analysis.results_page import cpu_description, git_commit, machine_kinds, stamp_lines, today

    page.parent.mkdir(parents=True, exist_ok=True)
    commit = git_commit(page.parent)  # before the figure is written: a rewritten figure would read as -dirty
    plot(table, page.with_suffix(".png"))
    lines = [f"# Serving: latency against load on a {machine_kinds(rows)} machine", "",
             "Generated by `python -m analysis.serving RESULTS --page PAGE`; do not edit by hand.", "",
             *stamp_lines(rows, "python -m experiments.research.recipe serving", commit, today(),
                          cpu_description()), "",
             f"![latency against throughput]({page.with_suffix('.png').name})", "", report_text(table, ttft, tpot)]
    page.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--out", type=Path, help="a folder for serving.md and serving.png")
    parser.add_argument("--page", type=Path, help="a stamped results page (its figure beside it)")
    parser.add_argument("--ttft", type=float, default=10.0, help="the objective's time to first token (s)")
    parser.add_argument("--tpot", type=float, default=0.5, help="the objective's time per output token (s)")
    args = parser.parse_args(argv)
    if args.out is None and args.page is None:
        parser.error("give --out FOLDER or --page PAGE")
    rows = load_rows(args.results)
    table = rate_table(rows, {"ttft_s": args.ttft, "tpot_s": args.tpot})
    if table.empty:
        print(f"no serving rows under {args.results}")
        return 1
    text = report_text(table, args.ttft, args.tpot)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "serving.md").write_text("# Serving: latency against load\n\n" + text)
        plot(table, args.out / "serving.png")
    if args.page is not None:
        write_page(table, rows, args.page, args.ttft, args.tpot)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
