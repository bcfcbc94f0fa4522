"""Learning curves of head training: held-out top-1 (and chain tau where recorded) against steps and
against tokens trained, from the trainers' ``metrics.jsonl`` validation rows; for the head cards.

    python -m analysis.learning_curve RUN_DIR_OR_METRICS [...] --out curve.png
    python -m analysis.learning_curve "EAGLE head=LEG1,LEG2" --out curve.png --scaling-out scaling.png
    python -m analysis.learning_curve "EAGLE-3=RUN@eagle3/top1" "EAGLE=RUN@head/top1" --out joint.png \
        --tau artifacts/smollm2/joint_run/tau.jsonl

A run given as ``LEG1,LEG2,...`` is one head trained in legs (each leg continued from the previous one's
export): the legs' rows are joined, each leg's steps and tokens counted on from the previous leg's last
validation. ``--scaling-out`` plots each run's held-out top-1 at 1/4, 1/2 and all of its tokens trained (the
validation nearest each share) and prints them as a table: with less than one pass over the corpus every
token trained was seen once, so the point at 1/4 is the head that saw 1/4 of the data (its learning rate not
yet annealed there).

``--tau LOG`` adds a third panel: MT-bench tau of the run's heads against the tokens trained, one line per
method, from the rows ``experiments.research.tau_along_run`` logs (snapshots of the run), the heads the run
started from drawn as dashed lines at their own tau; the log is printed as a table.

``--trend K`` prints each run's data-scaling trend (``analysis.trend``: a line of the held-out value against
log2 of the tokens over its last K validations): its gain per doubling of the tokens and over the next 4M
tokens (the flat rule's window), with ``--project TOKENS`` its value there and ``--goal V`` the tokens it needs.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis.png import save_png  # noqa: E402
from analysis.trend import trend_table  # noqa: E402
from eagle2.registry import display_name  # noqa: E402


def metrics_rows(source: str | Path, split: str) -> list[dict]:
    """The ``split`` rows (``val`` or ``train``) of a run's ``metrics.jsonl`` (a run folder or the file itself;
    shipped logs are kept gzipped: ``metrics.jsonl.gz``)."""
    path = Path(source)
    if path.is_dir():
        path = next((path / n for n in ("metrics.jsonl", "metrics.jsonl.gz") if (path / n).exists()),
                    path / "metrics.jsonl")
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [r for r in rows if r.get("split") == split]


def validation_rows(source: str | Path) -> list[dict]:
    """The validation rows of a run's ``metrics.jsonl``."""
    return metrics_rows(source, "val")


def cpu_kinds(source: str | Path) -> set[str]:
    """The CPU kinds the train rows of a run's ``metrics.jsonl`` record."""
    return {str(r["cpu_kind"]) for r in metrics_rows(source, "train") if r.get("cpu_kind")}


def stamp_text(sources: list[str]) -> str:
    """Commit, date and the runs' CPU kinds (read before any figure is written: a rewritten figure would
    make the checkout dirty)."""
    import datetime as dt

    from analysis.results_page import git_commit

    kinds = sorted(set().union(*(cpu_kinds(s) for s in sources))) or ["not recorded"]
    return (f"commit {git_commit(Path(__file__).resolve().parents[1])}, "
            f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d}, trained on CPU kind {', '.join(kinds)}")


def save_figure(figure, out: str | Path, stamped: str | None = None) -> Path:
    """Lay out ``figure``, write ``stamped`` (if any) in small type at its foot, save it to ``out``, close it."""
    figure.tight_layout()
    if stamped:  # (a figure for the docs names what made it)
        figure.text(0.99, 0.005, stamped, ha="right", va="bottom", fontsize=6, color="gray")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_png(figure, out, dpi=130)
    plt.close(figure)
    return out


def joined_legs(legs: list[list[dict]]) -> list[dict]:
    """The validation rows of a run trained in legs, steps and tokens counted on across the legs."""
    out: list[dict] = []
    for rows in legs:
        step0 = out[-1]["step"] if out else 0
        tokens0 = out[-1].get("tokens_trained", 0) if out else 0
        out += [{**r, "step": r["step"] + step0, "tokens_trained": r.get("tokens_trained", 0) + tokens0} for r in rows]
    return out


def scaling_points(rows: list[dict], key: str = "top1", shares=(0.25, 0.5, 1.0)) -> list[tuple[float, int, float]]:
    """(share, tokens trained, ``key``) at the validation nearest each share of the run's last tokens trained."""
    rows = [r for r in rows if key in r and "tokens_trained" in r]
    total = rows[-1]["tokens_trained"]
    picked = [min(rows, key=lambda r: abs(r["tokens_trained"] - share * total)) for share in shares]
    return [(share, r["tokens_trained"], r[key]) for share, r in zip(shares, picked)]


def plot_scaling(runs: dict[str, list[dict]], out: str | Path, key: str = "top1", stamped: str | None = None) -> Path:
    """Held-out ``key`` at 1/4, 1/2 and all of each run's tokens (log-scaled tokens axis)."""
    from matplotlib.ticker import NullFormatter

    fig, ax = plt.subplots(figsize=(5, 3.6))
    points = {name: scaling_points(rows, key) for name, rows in runs.items()}
    for name, pts in points.items():
        ax.plot([t / 1e6 for _, t, _ in pts], [v for _, _, v in pts], marker="o", label=name)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ticks = sorted({t / 1e6 for pts in points.values() for _, t, _ in pts})  # the measured points label the axis
    ax.set_xticks(ticks, [f"{t:.2g}" for t in ticks], fontsize=7)
    ax.set_xlabel("tokens trained (M), log scale")
    ax.set_ylabel(f"held-out {key}")
    ax.legend(fontsize=8)
    return save_figure(fig, out, stamped)


def tau_log(path: str | Path) -> list[dict]:
    """The rows of a ``tau_along_run`` log."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def tau_methods(rows: list[dict]) -> list[str]:
    """The methods a ``tau_along_run`` log measured: its ``<method>_tau`` fields, in the log's order."""
    return [key.removesuffix("_tau") for key in dict.fromkeys(k for r in rows for k in r if k.endswith("_tau"))]


def tau_table(rows: list[dict]) -> str:
    """A ``tau_along_run`` log as a markdown table: each method's mean tau over the turns (+- its standard
    error, where logged), the pooled tau in brackets."""
    methods = tau_methods(rows)
    lines = ["| heads | step | tokens trained | questions | "
             + " | ".join(f"{display_name(m)} tau (pooled)" for m in methods) + " |",
             "|---|---:|---:|---:|" + "---:|" * len(methods)]
    for r in rows:
        step = "" if r.get("step") is None else f"{r['step']:,}"
        tokens = "" if r.get("tokens_trained") is None else f"{r['tokens_trained'] / 1e6:.2f}M"
        taus = " | ".join(f"{r[f'{m}_tau']:.2f}" + (f" +- {r[f'{m}_tau_sem']:.2f}" if r.get(f"{m}_tau_sem") else "")
                          + f" ({r[f'{m}_tau_pooled']:.2f})" for m in methods)
        lines.append(f"| {r['heads']} | {step} | {tokens} | {r['questions']} | {taus} |")
    return "\n".join(lines)


def protocol(row: dict) -> tuple:
    """What a ``tau_along_run`` row measured over: questions, new tokens, tree size."""
    return row["questions"], row["max_new_tokens"], row["total_tokens"]


TAU_STYLES = (("-", "--", "s"), (":", "-.", "D"), ("-.", ":", "^"))  # a protocol's: snapshots, shipped, marker


def plot_tau(ax, rows: list[dict]) -> None:
    """MT-bench tau of each method against the tokens trained (snapshots), the heads the run started from as
    horizontal lines; one line style a protocol (questions, new tokens, tree), the log's first solid and dashed
    (styles repeat past the third). What every protocol shares goes in the title, the rest in the legend."""
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    by_protocol: dict[tuple, list[dict]] = {}
    for r in rows:
        by_protocol.setdefault(protocol(r), []).append(r)
    shared, methods = {(p[1], p[2]) for p in by_protocol}, tau_methods(rows)
    for (line, shipped_line, marker), (proto, measured) in zip(itertools.cycle(TAU_STYLES), by_protocol.items()):
        snapshots = sorted((r for r in measured if r["heads"] == "snapshot"), key=lambda r: r["tokens_trained"])
        detail = f"{proto[0]} q" if len(shared) == 1 else f"{proto[0]} q, {proto[1]} tok, {proto[2]}-token tree"
        for color, method in zip(colors[4:], methods):
            ax.plot([r["tokens_trained"] / 1e6 for r in snapshots], [r[f"{method}_tau"] for r in snapshots],
                    marker=marker, linestyle=line, color=color, label=f"{display_name(method)}, {detail}")
            for r in (r for r in measured if r["heads"] == "shipped"):
                ax.axhline(r[f"{method}_tau"], color=color, linestyle=shipped_line, linewidth=1)
    common = "" if len(shared) > 1 else " ({} tok, {}-token tree)".format(*next(iter(shared)))
    ax.set_title(f"MT-bench tau{common}; horizontal: the heads it started from", fontsize=8)
    ax.set_xlabel("tokens trained (M)")
    ax.legend(fontsize=7)


def tau_lines(runs: dict[str, list[dict]]) -> dict[str, tuple[list[int], list[float], int]]:
    """Per run whose validation rows carry the greedy-chain tau (``val_set: mtbench``): (steps, tau, the step of
    the best tau, which ``best_by: tau`` exports)."""
    lines = {}
    for name, rows in runs.items():
        rows = [r for r in rows if "chain_tau" in r]
        if rows:
            best = max(rows, key=lambda r: r["chain_tau"])  # (the first of equal ones, as the trainer keeps it)
            lines[name] = ([r["step"] for r in rows], [r["chain_tau"] for r in rows], best["step"])
    return lines


def plot_curves(runs: dict[str, list[dict]], out: str | Path, key: str = "top1", stamped: str | None = None,
                tau: list[dict] | None = None) -> Path:
    """One line per run: ``key`` against the step (left) and the tokens trained (right); with ``tau`` (a
    ``tau_along_run`` log), MT-bench tau against the tokens trained in a third panel."""
    fig, axes = plt.subplots(1, 3 if tau else 2, figsize=(15 if tau else 10, 3.6))
    axes[1].sharey(axes[0])
    if tau:
        plot_tau(axes[2], tau)
    for name, rows in runs.items():
        rows = [r for r in rows if key in r]
        axes[0].plot([r["step"] for r in rows], [r[key] for r in rows], marker="o", label=name)
        if all("tokens_trained" in r for r in rows):
            axes[1].plot([r["tokens_trained"] / 1e6 for r in rows], [r[key] for r in rows], marker="o", label=name)
    taus = tau_lines(runs) if key != "chain_tau" else {}
    if taus:  # tau beside top-1 (dashed, right axis), the best-by-tau checkpoint marked
        right = axes[0].twinx()
        for name, (steps, values, best) in taus.items():
            right.plot(steps, values, linestyle="--", marker=".", label=f"{name} tau")
            right.plot([best], [values[steps.index(best)]], marker="*", markersize=12, color="black")
        right.set_ylabel("held-out chain tau (dashed; *: best)")
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("tokens trained (M)")
    axes[0].set_ylabel(f"held-out {key}")
    axes[0].legend(fontsize=8)
    return save_figure(fig, out, stamped)


def run_rows(spec: str, key: str) -> list[dict]:
    """The validation rows of a run given as ``LEG1,LEG2`` (legs joined), or ``LEGS@FIELD``: the run's
    ``FIELD`` drawn as ``key`` (a joint run logs each head's stats under its own name: ``eagle3/top1``)."""
    legs, _, field = spec.partition("@")
    rows = joined_legs([validation_rows(leg) for leg in legs.split(",")])
    return [{**r, key: r[field]} for r in rows if field in r] if field else rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders (with metrics.jsonl) or metrics.jsonl files; LEG1,LEG2: "
                                           "one run in legs; NAME=...: its label; ...@FIELD: that field as --key")
    ap.add_argument("--out", required=True)
    ap.add_argument("--key", default="top1")
    ap.add_argument("--scaling-out", help="also the data-scaling figure (1/4, 1/2, all of the tokens) here")
    ap.add_argument("--tau", help="a tau_along_run log: MT-bench tau against the tokens trained, a third panel")
    ap.add_argument("--trend", type=int, metavar="K", help="print each run's trend over its last K validations")
    ap.add_argument("--project", type=float, metavar="TOKENS", help="with --trend: the trend's value at TOKENS")
    ap.add_argument("--goal", type=float, help="with --trend: the tokens at which the trend reaches GOAL")
    args = ap.parse_args()
    named = [str(r).split("=", 1) if "=" in str(r) else [str(r), str(r)] for r in args.runs]
    runs = {name: run_rows(legs, args.key) for name, legs in named}
    stamped = stamp_text([leg for _, legs in named for leg in legs.split("@")[0].split(",")])
    tau = tau_log(args.tau) if args.tau else None
    out = plot_curves(runs, args.out, args.key, stamped, tau)
    print(f"[learning_curve] {sum(len(v) for v in runs.values())} validations -> {out}")
    if tau:
        print(tau_table(tau))
    if args.trend:
        print(trend_table(runs, args.key, args.trend, args.project, args.goal))
    if args.scaling_out:
        print(f"| run | share of tokens | tokens trained | held-out {args.key} |\n|---|---|---|---|")
        for name, rows in runs.items():
            for share, tokens, value in scaling_points(rows, args.key):
                print(f"| {name} | {share:g} | {tokens / 1e6:.2f}M | {value:.3f} |")
        print(f"[learning_curve] data scaling -> {plot_scaling(runs, args.scaling_out, args.key, stamped)}")


if __name__ == "__main__":
    main()
