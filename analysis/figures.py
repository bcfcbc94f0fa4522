"""Paper-style figures from the metrics frames, each saved as PNG (a palette PNG: ``analysis.png``) and PDF at
paper size.

- ``speedup_bars``: speedup over plain per benchmark and method (EAGLE-2 paper Fig. 1 style);
- ``calibration_diagram``: draft confidence against acceptance rate, with the y = x line and the node
  count of each bin (Fig. 6 style);
- ``position_acceptance``: acceptance by draft position (Fig. 5 style);
- ``tree_budget_curves``: speedup and tau against the tree budget ``total_tokens``.

Every function takes frames that ``analysis.metrics`` computed and returns the files it wrote; it draws
nothing from raw rows itself.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.png import save_png  # noqa: E402
from analysis.tables import in_table_order, title  # noqa: E402
from eagle2.registry import display_name, method_rank  # noqa: E402

FULL_WIDTH = 6.75  # inches: a two-column paper's text width
PAPER_STYLE = {"font.size": 8, "axes.titlesize": 9, "axes.labelsize": 8, "legend.fontsize": 7,
               "xtick.labelsize": 7, "ytick.labelsize": 7, "savefig.dpi": 300, "savefig.bbox": "tight",
               "pdf.fonttype": 42, "axes.spines.top": False, "axes.spines.right": False}


def save(fig, out: Path, name: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    save_png(fig, paths[0])
    fig.savefig(paths[1])
    plt.close(fig)
    return paths


def pretty(label: str) -> str:
    """'eagle2 (total_tokens=8)' -> 'EAGLE-2 (total_tokens=8)'."""
    head, _, rest = label.partition(" ")
    return f"{display_name(head)} {rest}".strip()


def speedup_bars(cells: pd.DataFrame, out: Path, max_labels: int = 8) -> tuple[list[Path], list[str]]:
    """Grouped bars from ``tables.table1_frame`` (ours only): one panel per model and temperature."""
    ours = cells[cells.source == "ours"]
    notes: list[str] = []
    if ours.empty:
        return [], ["speedup bars: no method other than plain has rows"]
    groups = list(ours.groupby(["model", "temperature"], sort=False))
    with plt.rc_context(PAPER_STYLE):
        fig, axes = plt.subplots(len(groups), 1, figsize=(FULL_WIDTH, 2.3 * len(groups)), squeeze=False)
        for ax, ((model, temp), g) in zip(axes[:, 0], groups):
            labels = list(dict.fromkeys(g.label))
            if len(labels) > max_labels:
                notes.append(f"speedup bars, {model} T={temp:g}: {len(labels)} method configs, the first "
                             f"{max_labels} drawn (all are in table1.md)")
                labels = labels[:max_labels]
            datasets = in_table_order(g.dataset) + (["mean"] if "mean" in set(g.dataset) else [])
            width = 0.8 / len(labels)
            x = np.arange(len(datasets))
            for i, label in enumerate(labels):
                lg = g[g.label == label].set_index("dataset")
                values = [lg.speedup.get(d, np.nan) for d in datasets]
                pos = x - 0.4 + width * (i + 0.5)
                ax.bar(pos, np.nan_to_num(values, nan=0.0), width, label=pretty(label))
                for p, d, v in zip(pos, datasets, values):
                    if d not in lg.index:
                        continue  # not run: no bar, no text
                    if np.isnan(v):
                        ax.text(p, 0.05, "no baseline", rotation=90, ha="center", va="bottom", fontsize=6)
                    else:
                        ax.text(p, v, f"{v:.2f}x", ha="center", va="bottom", fontsize=6)
            ax.axhline(1.0, color="grey", lw=0.8, ls="--", label="plain decoding (1x)")
            ax.set_xticks(x, [title(d) for d in datasets])
            ax.set_ylim(0, max(1.15, 1.15 * np.nan_to_num(g.speedup.max(), nan=1.0)))
            ax.set_ylabel("speedup over plain (x)")
            ax.set_title(f"Speedup by benchmark: {model}, temperature {temp:g}")
            ax.legend(ncols=min(4, len(labels) + 1), loc="upper left", bbox_to_anchor=(0, -0.15), frameon=False)
        fig.tight_layout()
        return save(fig, out, "speedup_bars"), notes


def calibration_diagram(table: pd.DataFrame, ece: pd.Series, out: Path) -> list[Path]:
    """Reliability diagram per method from ``metrics.calibration``: bars = acceptance per confidence bin."""
    methods = sorted(set(table.method), key=method_rank)
    with plt.rc_context(PAPER_STYLE):
        fig, axes = plt.subplots(1, len(methods), figsize=(3.3 * len(methods), 3.1), squeeze=False)
        for ax, method in zip(axes[0], methods):
            g = table[table.method == method]
            centers = (g.bin_low + g.bin_high) / 2
            ax.bar(centers, g.acceptance, width=(g.bin_high - g.bin_low) * 0.9, color="tab:blue", alpha=0.75,
                   label="acceptance rate of the bin")
            ax.plot(g.confidence, g.acceptance, "o", ms=3, color="tab:red", label="at the bin's mean confidence")
            ax.plot([0, 1], [0, 1], "--", color="black", lw=0.9, label="y = x (perfect calibration)")
            for c, a, n in zip(centers, g.acceptance, g["count"]):
                ax.text(c, min(a + 0.02, 0.97), f"n={n}", ha="center", va="bottom", fontsize=5.5, rotation=90)
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1.05)
            ax.set_xlabel("draft confidence (probability, 0-1)")
            ax.set_ylabel("acceptance rate (share of tried nodes)")
            ax.set_title(f"{display_name(method)}: confidence vs acceptance (ECE {ece.get(method, np.nan):.3f})")
            ax.legend(loc="upper left", frameon=False)
        fig.tight_layout()
        return save(fig, out, "calibration")


def position_acceptance(frame: pd.DataFrame, out: Path) -> list[Path]:
    """From ``metrics.per_position_acceptance`` (config_hash holding a label): two panels by draft position."""
    reach = frame[frame.p_at_least > 0].depth.max() if (frame.p_at_least > 0).any() else 1
    frame = frame[frame.depth <= reach + 1]
    with plt.rc_context(PAPER_STYLE):
        fig, (left, right) = plt.subplots(1, 2, figsize=(FULL_WIDTH, 2.8))
        for key, g in frame.groupby(["model", "config_hash", "temperature"], sort=False):
            model, label, temp = key
            name = f"{pretty(label)}, {model}, T={temp:g}"
            left.plot(g.depth, g.p_at_least, "o-", ms=3, label=name)
            right.plot(g.depth, g.conditional, "o-", ms=3)
        left.set_title("Rounds accepting >= d drafted tokens")
        left.set_ylabel("share of rounds (0-1)")
        right.set_title("Acceptance at position d (d-1 accepted)")
        right.set_ylabel("acceptance rate (0-1)")
        for ax in (left, right):
            ax.set_xlabel("draft position d (tokens after the root)")
            ax.set_ylim(0, 1.02)
            ax.set_xlim(0.5, reach + 1.5)
            ax.set_xticks(range(1, int(reach) + 2))
        fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), ncols=2, frameon=False)
        fig.tight_layout()
        return save(fig, out, "acceptance_by_position")


def tree_budget_curves(tb: pd.DataFrame, out: Path) -> list[Path]:
    """From ``metrics.tree_budget_table``: speedup and tau against total_tokens, a line per (depth, top_k);
    ``total_tokens=auto`` configs are stars at their mean chosen budget.

    One row of panels per (model, benchmark, temperature) that has two or more total_tokens values.
    """
    tb = tb.copy()
    tb["auto"] = tb.total_tokens.astype(str) == "auto"
    tb["x"] = np.where(tb.auto, tb.mean_budget, pd.to_numeric(tb.total_tokens, errors="coerce"))
    groups = [(k, g) for k, g in tb.groupby(["model", "dataset", "temperature"], sort=False)
              if g.total_tokens.astype(str).nunique() >= 2]
    with plt.rc_context(PAPER_STYLE):
        fig, axes = plt.subplots(len(groups), 2, figsize=(FULL_WIDTH, 2.4 * len(groups) + 0.4), squeeze=False)
        for (left, right), ((model, dataset, temp), g) in zip(axes, groups):
            for (depth, top_k), line in g.groupby(["depth", "top_k"], dropna=False):
                name = f"depth {depth:g}, top_k {top_k:g}"
                fixed, auto = line[~line.auto].sort_values("x"), line[line.auto]
                for ax, col in ((left, "speedup"), (right, "tau")):
                    drawn = ax.plot(fixed.x, fixed[col], "o-", ms=3, label=name)
                    if not auto.empty:
                        color = drawn[0].get_color()
                        ax.plot(auto.x, auto[col], "*", ms=9, color=color, label=f"{name}, auto (mean budget)")
            if g.speedup.isna().all():
                left.text(0.5, 0.5, "no baseline (no plain rows)", ha="center", transform=left.transAxes)
            where = f"{title(dataset)}, {model}, T={temp:g}"
            left.set_title(f"Speedup, {where}")
            left.set_ylabel("speedup over plain (x)")
            right.set_title(f"tau, {where}")
            right.set_ylabel("tau (tokens per target forward)")
            for ax in (left, right):
                ax.set_xlabel("total_tokens (nodes verified per round)")
                ax.set_xticks(sorted(g.loc[~g.auto, "x"].dropna().unique()))
            right.legend(loc="best", frameon=False)
        fig.tight_layout()
        return save(fig, out, "tree_budget")
