"""Table 1 of the EAGLE-2 paper from our rows: speedup / tau per method x benchmark, plus a Mean column,
grouped by model and temperature, with the published numbers beside ours where the model matches.

When the rows hold eager and compiled runs both (``experiment=baseline_strength``), every cell carries two
speedups, over eager plain decoding and over compiled plain decoding (``analysis.metrics``), the labels say
which kind each config is, and plain decoding itself is a row (its speedup over the other plain); rows of one
kind give the tables they always gave.

The oracle (``method=oracle``, a tau ceiling whose speed is no method's) is not a Table 1 row:
``oracle_markdown`` lays out each method's tau as a share of the oracle's (``metrics.oracle_efficiency``).

``table1_frame`` builds the numbers (long format, one line per table cell) from ``analysis.metrics``;
``to_markdown`` and ``to_latex`` only lay them out. Published numbers come from
``results/published/eagle2_table1.tsv`` (cells ``speedup x/tau``, columns named by its ``# Columns:`` line, its
models matched to ours by its ``# Models:`` line, its methods by their registered display names).
Benchmarks, their column titles and the order of benchmarks and methods come from ``eagle2.registry``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.metrics import ORACLE, both_kinds, method_table, variant_labels
from eagle2.registry import benchmark, known_benchmarks, known_methods, method, method_rank

PUBLISHED = Path(__file__).resolve().parents[1] / "results" / "published" / "eagle2_table1.tsv"
COLUMNS = ["model", "temperature", "label", "method", "source", "dataset", "speedup", "tau", "turns", "config_hash",
           "dtype"]
BOTH = ["speedup_eager", "speedup_compiled"]  # with eager and compiled rows both: over each plain


def title(dataset: str) -> str:
    """A benchmark's column title ("MT-bench"); ``mean`` -> "Mean"; an unregistered dataset keeps its name."""
    return "Mean" if dataset == "mean" else benchmark(dataset).title if dataset in known_benchmarks() else dataset


def in_table_order(datasets) -> list[str]:
    """The registered benchmarks among ``datasets`` in their order, then the others sorted (no ``mean``)."""
    present, known = set(datasets) - {"mean"}, known_benchmarks()
    return [d for d in known if d in present] + sorted(present - set(known))


def _declared(lines: list[str], key: str) -> str:
    """The text after ``# key:`` in the published table's comment lines ('' when it has none)."""
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(f"# {key}:")), "")


def load_published(path: str | Path = PUBLISHED) -> pd.DataFrame:
    """The paper's Table 1, long: temperature, model (ours, by its ``# Models:`` line; else the paper's code),
    code (the paper's), method (ours, by its display name; else the paper's), dataset, speedup, tau. Its columns
    are named by its own ``# Columns:`` line; a benchmark column is matched by its title."""
    path = Path(path)
    if not path.is_file():
        return pd.DataFrame(columns=["temperature", "model", "code", "method", "dataset", "speedup", "tau"])
    lines = path.read_text().splitlines()
    header = _declared(lines, "Columns").split("\t")
    models = {code: ours for ours, code in (pair.split("=") for pair in _declared(lines, "Models").split(", ") if pair)}
    methods = {method(m).display: m for m in known_methods()}
    names = {title(d): d for d in [*known_benchmarks(), "mean"]}
    out = []
    for line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        cells = dict(zip(header, line.split("\t")))
        for column in header[3:]:
            speedup, tau = cells[column].split("/")
            out.append({"temperature": float(cells["temp"]), "model": models.get(cells["model"], cells["model"]),
                        "code": cells["model"], "method": methods.get(cells["method"], cells["method"]),
                        "dataset": names.get(column, column), "speedup": float(speedup.rstrip("x")),
                        "tau": float(tau)})
    return pd.DataFrame(out)


def table1_frame(rows: pd.DataFrame, published: pd.DataFrame | None = None) -> tuple[pd.DataFrame, list[str]]:
    """(cells, notes). One line per (model, temperature, row label, dataset incl. 'mean') with speedup and tau.

    Ours come from ``method_table`` (plain is the baseline, not a row, unless the rows hold eager and compiled
    runs: then plain of each kind is a row and ``BOTH`` columns hold the speedups over each plain). When one
    label has several configs on a benchmark (say, different token limits) the one with the most turns is shown
    and the others are noted. A missing plain baseline leaves speedup NaN. Mean: over the benchmarks shown in
    that model/temperature.
    """
    notes: list[str] = []
    two = not rows.empty and both_kinds(rows)
    columns = COLUMNS + BOTH if two else COLUMNS
    if rows.empty:
        return pd.DataFrame(columns=columns), notes
    table = method_table(rows)
    table = table[~table.method.isin([ORACLE] if two else ["plain", ORACLE])].copy()  # the oracle: oracle_markdown
    if table.empty:
        return pd.DataFrame(columns=columns), notes
    table["label"] = table.config_hash.map(variant_labels(rows))
    mixed = table.groupby(["model", "temperature"]).dtype.transform("nunique") > 1
    table.loc[mixed, "label"] = table.label[mixed] + " (" + table.dtype[mixed].astype(str) + ")"  # never merged
    table = table.sort_values("turns", ascending=False, kind="stable")
    keys = ["model", "temperature", "label", "dataset"]
    shown = table.drop_duplicates(keys, keep="first").set_index(keys)
    for _, d in table[table.duplicated(keys, keep="first")].iterrows():
        kept = shown.loc[(d.model, d.temperature, d.label, d.dataset)]
        than = "more turns" if kept.turns > d.turns else f"as many turns ({kept.turns}); the first found is shown"
        notes.append(f"{d.model} T={d.temperature} {d.label} on {d.dataset}: config {d.config_hash} "
                     f"({d.turns} turns) not shown; config {kept.config_hash} of that label has {than}")
    table = table.drop_duplicates(keys, keep="first")
    cells = [{"model": r.model, "temperature": float(r.temperature), "label": r.label, "method": r.method,
              "source": "ours", "dataset": r.dataset, "speedup": r.speedup, "tau": r.tau, "turns": int(r.turns),
              "config_hash": r.config_hash, "dtype": r.dtype, **{c: getattr(r, c) for c in BOTH if two}}
             for r in table.itertuples()]
    frame = pd.DataFrame(cells)
    if published is not None and not published.empty:
        frame = pd.concat([frame, _paper_cells(frame, published)], ignore_index=True)
        paper = frame.source == "paper"
        if two and paper.any():  # the paper measured over its eager baseline
            frame.loc[paper, "speedup_eager"] = frame.speedup[paper].astype(float)
    frame = _with_means(frame, published)
    frame["order"] = [(method_rank(m), 1 if s == "paper" else 0) for m, s in zip(frame.method, frame.source)]
    frame = frame.sort_values(["model", "temperature", "order", "label"]).drop(columns="order")
    return frame.reset_index(drop=True)[columns], notes


def _paper_cells(ours: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    out = []
    for (model, temp), g in ours.groupby(["model", "temperature"]):
        for name in sorted(set(g.method), key=method_rank):
            paper = published[(published.model == model) & (published.temperature == temp)
                              & (published.method == name)]
            for _, p in paper[paper.dataset != "mean"].iterrows():
                out.append({"model": model, "temperature": temp, "label": f"{method(name).display} (paper, {p.code})",
                            "method": name, "source": "paper", "dataset": p.dataset, "speedup": p.speedup,
                            "tau": p.tau, "turns": 0, "config_hash": None, "dtype": None})
    return pd.DataFrame(out, columns=COLUMNS)


def _with_means(frame: pd.DataFrame, published: pd.DataFrame | None) -> pd.DataFrame:
    """Append a 'mean' cell per row label over the benchmarks ours show in that model/temperature."""
    means = []
    for (model, temp), g in frame.groupby(["model", "temperature"]):
        shown = set(g[g.source == "ours"].dataset)
        for _, lg in g.groupby("label"):
            cells = lg[lg.dataset.isin(shown)]
            first = lg.iloc[0]
            speedup, tau = cells.speedup.mean(skipna=False), cells.tau.mean()
            both = {c: cells[c].mean(skipna=False) for c in BOTH if c in cells}
            if first.source == "paper" and published is not None and shown == set(known_benchmarks()):
                paper = published[(published.model == model) & (published.temperature == temp)
                                  & (published.method == first.method) & (published.dataset == "mean")]
                if not paper.empty:  # the paper's own Mean column
                    speedup, tau = float(paper.speedup.iloc[0]), float(paper.tau.iloc[0])
            means.append({**first.to_dict(), "dataset": "mean", "speedup": speedup, "tau": tau, **both,
                          "turns": int(cells.turns.sum()), "config_hash": None})
    return pd.concat([frame, pd.DataFrame(means, columns=frame.columns)], ignore_index=True)


def _datasets_shown(frame: pd.DataFrame) -> list[str]:
    present = set(frame[frame.source == "ours"].dataset)
    return [*in_table_order(present), "mean"]


def fmt_speedup(value: float) -> str:
    return "no baseline" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}x"


def fmt_tau(value: float) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"


def _speedup_columns(frame: pd.DataFrame) -> list[str]:
    """The speedups a cell shows: over eager and over compiled plain when the frame has both, else one."""
    return BOTH if all(c in frame for c in BOTH) else ["speedup"]


def _grid(frame: pd.DataFrame, columns: list[str]):
    """(model, temperature, [(label, {dataset: (speedup, ..., tau)})]) per group, rows in table order; a cell
    holds the frame's ``_speedup_columns``, then tau."""
    values = [*_speedup_columns(frame), "tau"]
    for (model, temp), g in frame.groupby(["model", "temperature"], sort=False):
        lines = []
        for label in dict.fromkeys(g.label):
            cells = g[g.label == label].set_index("dataset")
            lines.append((label, {d: tuple(cells[v][d] for v in values) if d in cells.index else None
                                  for d in columns}))
        yield model, temp, lines


def to_markdown(frame: pd.DataFrame) -> str:
    """Sections per model and temperature; cells 'speedup / tau'."""
    if frame.empty:
        return "No method other than plain has rows: nothing to tabulate.\n"
    columns = _datasets_shown(frame)
    cell = ("speedup over eager plain / over compiled plain" if len(_speedup_columns(frame)) == 2 else
            "speedup over plain decoding")
    parts = [f"Cells: {cell} on the same question turns / tau (tokens per target forward). "
             "Mean: over the benchmarks shown. 'no baseline': no plain rows for that model, benchmark, "
             "temperature, dtype, seed, token limit and batch size sharing its question turns (summary.md names "
             "the missing baseline). A method label carries its dtype when the rows hold several"
             + (", and its kind of target forward ([eager] or [compiled]; plain rows: the one plain over the "
                "other)" if len(_speedup_columns(frame)) == 2 else "") + ".\n"]
    for model, temp, lines in _grid(frame, columns):
        body = [[label] + [("—" if c is None else " / ".join([*map(fmt_speedup, c[:-1]), fmt_tau(c[-1])]))
                           for c in cells.values()] for label, cells in lines]
        head = ["Method"] + [title(d) for d in columns]
        parts.append(f"### {model}, temperature {temp:g}\n\n" + pd.DataFrame(body, columns=head).to_markdown(
            index=False) + "\n")
    return "\n".join(parts)


def _tex(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("_", r"\_"), ("&", r"\&"), ("%", r"\%"), ("#", r"\#")):
        text = text.replace(a, b)
    return text


def to_latex(frame: pd.DataFrame) -> str:
    """One booktabs tabular like the paper's: Speedup and tau per benchmark, blocks per temperature/model."""
    if frame.empty:
        return "% No method other than plain has rows: nothing to tabulate.\n"
    columns = _datasets_shown(frame)
    per = len(_speedup_columns(frame)) + 1  # sub-columns per benchmark: the speedup(s), then tau
    heads = r"Speedup & $\tau$" if per == 2 else r"over eager & over compiled & $\tau$"
    width = 1 + per * len(columns)
    lines = [r"% Table 1 (generated by analysis.report). Needs \usepackage{booktabs}.",
             r"\begin{tabular}{l" + (" " + "r" * per) * len(columns) + "}", r"\toprule",
             " & " + " & ".join(rf"\multicolumn{{{per}}}{{c}}{{{_tex(title(d))}}}" for d in columns) + r" \\",
             " ".join(rf"\cmidrule(lr){{{2 + per * i}-{1 + per * (i + 1)}}}" for i in range(len(columns))),
             "Method & " + " & ".join([heads] * len(columns)) + r" \\", r"\midrule"]
    for model, temp, rows in _grid(frame, columns):
        lines.append(rf"\multicolumn{{{width}}}{{l}}{{\textit{{{_tex(model)}, temperature {temp:g}}}}} \\")
        for label, cells in rows:
            values = []
            for c in cells.values():
                if c is None:
                    values += ["--"] * per
                else:
                    values += ["n/b" if np.isnan(sp) else f"{sp:.2f}" + r"$\times$" for sp in c[:-1]]
                    values.append(fmt_tau(c[-1]))
            lines.append(_tex(label) + " & " + " & ".join(values) + r" \\")
        lines.append(r"\midrule")
    lines[-1] = r"\bottomrule"
    lines += [r"\end{tabular}", r"% n/b: no plain baseline for that cell; --: not run."]
    return "\n".join(lines) + "\n"


def oracle_markdown(frame: pd.DataFrame) -> str:
    """Oracle efficiency per model and temperature: rows = configs, columns = benchmarks, cells
    'tau / oracle tau = share' (the oracle of the config's draft depth, ``metrics.oracle_efficiency``)."""
    if frame.empty:
        return "No oracle rows (method=oracle at temperature 0): no oracle efficiency.\n"
    present = set(frame.dataset)
    columns = in_table_order(present)
    parts = ["Oracle efficiency: a method's tau over the oracle's on the same question turns (the oracle proposes "
             "what the target will emit, as deep as the method drafts: oracle depth in brackets). Cells: "
             "tau / oracle tau = share. The oracle's speed is not a method's speed.\n"]
    for (model, temp), g in frame.groupby(["model", "temperature"], sort=False):
        body = []
        for label, lg in g.groupby("label", sort=False):
            cells = lg.set_index("dataset")
            depth = _plain_int(lg.oracle_depth.iloc[0])
            mean = lg.efficiency.mean()
            body.append([f"{label} [oracle depth {depth}]"] + [
                f"{cells.tau[d]:.2f} / {cells.oracle_tau[d]:.2f} = {cells.efficiency[d]:.2f}" if d in cells.index
                else "—" for d in columns] + [f"{mean:.2f}"])
        head = ["Method"] + [title(d) for d in columns] + ["Mean share"]
        parts.append(f"### {model}, temperature {temp:g}\n\n" + pd.DataFrame(body, columns=head).to_markdown(
            index=False) + "\n")
    return "\n".join(parts)


def _plain_int(value):
    return int(value) if isinstance(value, float) and value.is_integer() else value
