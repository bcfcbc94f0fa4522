"""The speedup-versus-batch curve: each method's throughput and its speedup over batched plain decoding at
the same batch size B, against B.

``scaling_table`` turns result rows (several ``batch_size`` values) into one line per (model, dataset,
temperature, method, B): ``throughput`` (all new tokens over the batch's wall span, prefill included:
``eagle2.results.throughput``; at B = 1 the turns' summed time), the mean per-request decode rate and latency,
``speedup`` = throughput / plain's throughput at the same B, and ``scaling`` = throughput / the same
method's throughput at B = 1. ``scaling_figure`` draws throughput and speedup against B, one line per method
(paper style); ``scaling_markdown`` is the side-by-side table. Reads rows only; never runs a model.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.figures import PAPER_STYLE, save  # noqa: E402
from eagle2.registry import display_name, method_rank  # noqa: E402
from eagle2.results.throughput import batch_throughput  # noqa: E402

SETTING = ["model", "dataset", "temperature"]
COLUMNS = [*SETTING, "method", "batch_size", "turns", "new_tokens", "wall_span_s", "throughput", "speedup",
           "scaling", "request_tokens_per_s", "mean_latency_s"]


def has_batch_sweep(rows: pd.DataFrame) -> bool:
    """Rows of two or more batch sizes: a curve to draw."""
    return not rows.empty and "batch_size" in rows and rows.batch_size.fillna(1).nunique() > 1


def scaling_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per (model, dataset, temperature, method, batch size); see the module docstring."""
    rows = rows.assign(batch_size=rows.batch_size.fillna(1).astype(int) if "batch_size" in rows else 1)
    out = []
    for key, g in rows.groupby([*SETTING, "method", "batch_size"], dropna=False):
        t = batch_throughput(g.to_dict("records"))
        out.append({**dict(zip([*SETTING, "method", "batch_size"], key)), "turns": len(g),
                    "new_tokens": int(g.new_tokens.sum()), "wall_span_s": t["wall_span_s"],
                    "throughput": t["throughput_tokens_per_s"], "request_tokens_per_s": t["request_tokens_per_s"],
                    "mean_latency_s": t["mean_latency_s"]})
    table = pd.DataFrame(out, columns=[c for c in COLUMNS if c not in ("speedup", "scaling")])
    if table.empty:
        return pd.DataFrame(columns=COLUMNS)
    plain = table[table.method == "plain"].set_index([*SETTING, "batch_size"]).throughput
    one = table[table.batch_size == 1].set_index([*SETTING, "method"]).throughput
    table["speedup"] = [plain.get(k, np.nan) for k in zip(*(table[c] for c in [*SETTING, "batch_size"]))]
    table["speedup"] = table.throughput / table.speedup
    table["scaling"] = [one.get(k, np.nan) for k in zip(*(table[c] for c in [*SETTING, "method"]))]
    table["scaling"] = table.throughput / table.scaling
    table["order"] = table.method.map(method_rank)
    table = table.sort_values([*SETTING, "order", "batch_size"]).drop(columns="order")
    return table.reset_index(drop=True)[COLUMNS]


def scaling_markdown(table: pd.DataFrame) -> str:
    """Per setting: a method x B grid of 'tokens/s (speedup x)', then plain's B-over-B=1 ratio."""
    parts = []
    for key, g in table.groupby(SETTING, sort=False):
        sizes = sorted(g.batch_size.unique())
        head = f"**{key[0]} / {key[1]} / T={key[2]:g}**: throughput, tokens/s (speedup over plain at the same B)"
        lines = [head, "", "| method | " + " | ".join(f"B={b}" for b in sizes) + " |",
                 "|---|" + "---:|" * len(sizes)]
        for method, m in sorted(g.groupby("method"), key=lambda kv: method_rank(kv[0])):
            cells = {int(r.batch_size): f"{r.throughput:.2f} ({r.speedup:.2f}x)" for r in m.itertuples()}
            lines.append(f"| {display_name(method)} | " + " | ".join(cells.get(b, "") for b in sizes) + " |")
        plain = g[g.method == "plain"]
        if len(plain) > 1 and (plain.batch_size == 1).any():
            ratios = ", ".join(f"B={int(r.batch_size)}: {r.scaling:.2f}x" for r in plain.itertuples()
                               if r.batch_size > 1)
            lines += ["", f"Batched plain throughput over plain at B=1: {ratios}."]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def scaling_figure(table: pd.DataFrame, out: Path, name: str = "batch_scaling",
                   stamped: str | None = None) -> list[Path]:
    """Throughput and speedup over batched plain against B, one line per method; one figure per setting
    (the first is ``name``, others ``name_<model>_<dataset>_T<t>``); ``stamped``: a line at the foot naming what
    made it (commit, date, CPU kind, threads)."""
    paths = []
    for i, (key, g) in enumerate(table.groupby(SETTING, sort=False)):
        with plt.rc_context(PAPER_STYLE):
            fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(6.75, 2.4), layout="constrained")
            for method, m in sorted(g.groupby("method"), key=lambda kv: method_rank(kv[0])):
                m = m.sort_values("batch_size")
                label = display_name(method)
                ax_t.plot(m.batch_size, m.throughput, marker="o", ms=3, label=label)
                ax_s.plot(m.batch_size, m.speedup, marker="o", ms=3, label=label)
            sizes = sorted(g.batch_size.unique())
            for ax in (ax_t, ax_s):
                ax.set_xscale("log", base=2)
                ax.set_xticks(sizes, [str(b) for b in sizes])
                ax.set_xlabel("batch size B")
                ax.grid(alpha=0.3)
                ax.set_ylim(bottom=0)
            ax_s.axhline(1.0, color="grey", lw=0.8, ls="--")
            ax_t.set_ylabel("throughput (tokens/s)")
            ax_s.set_ylabel("speedup over plain (same B)")
            ax_t.legend(frameon=False)
            fig.suptitle(f"{key[0]} on {key[1]}, T={key[2]:g}", fontsize=9)
            if stamped:
                fig.supxlabel(stamped, x=0.99, ha="right", fontsize=5, color="gray")  # the layout makes room
            suffix = "" if i == 0 else f"_{key[0]}_{key[1]}_T{key[2]:g}"
            paths += save(fig, out, name + suffix)
    return paths
