"""The report of a results folder: ``python -m analysis.report RESULTS_DIR --out OUT_DIR [--wandb]``.

Reads every row and per-node record under RESULTS_DIR (``analysis.metrics``) and writes into OUT_DIR:

- ``table1.md`` / ``table1.tex`` / ``table1.csv``: speedup / tau per method x benchmark and a Mean column,
  by model and temperature, with the EAGLE-2 paper's numbers beside ours where the model matches;
- ``methods.csv`` / ``methods.md``: every config's tokens/s, speedup, tau, time shares and the cost model's
  predicted speedup (``experiment=four_methods``'s table);
- ``speedup_bars``, ``calibration``, ``acceptance_by_position``, ``tree_budget``: figures, PNG and PDF;
- ``calibration.csv``, ``acceptance_by_rank.csv``, ``acceptance_by_position.csv``, ``tree_budget.csv``,
  ``failures.csv``: the numbers behind them;
- ``batch_scaling.md`` / ``.csv`` / figure: throughput and speedup over batched plain against the batch size
  (rows of several ``batch_size``: ``experiment=batch_scaling``);
- ``oracle_efficiency.md`` / ``.csv``: each config's tau as a share of the oracle's (``method=oracle``,
  the tau ceiling at that draft depth; the oracle is labelled as such and is no Table 1 row);
- ``identity.csv``: per greedy speculative config, turns identical to plain decoding, numeric and
  algorithmic divergences (from ``python -m eagle2.identity`` records) and unaudited ones;
- ``summary.md``: what was written, what was skipped and why, the identity audit's totals, and the
  failures still standing.

With ``--page PAGE [--command CMD]`` it also writes a machine's results page (``analysis.results_page``:
the headline table stamped with commit, date, CPU kind and flags, dtype and the command that made the rows),
e.g. ``docs/results/<cpu-kind>.md``, which ``python -m analysis.status`` copies into README.md.

An input that is missing (no node records, no plain baseline, no tree-budget sweep) is skipped with a
note. ``--wandb`` also logs the figures and tables (per-node records included) to an offline W&B run.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from pathlib import Path

import pandas as pd

from analysis import batch_scaling, figures
from analysis.metrics import (
    METHOD_COLUMNS,
    ORACLE,
    acceptance_by_rank,
    both_kinds,
    calibration,
    expected_calibration_error,
    load_failures,
    load_nodes,
    load_rows,
    method_table,
    missing_baseline,
    oracle_efficiency,
    per_position_acceptance,
    tree_budget_table,
    unreadable_lines,
    variant_labels,
    with_cost_model,
)
from analysis.results_page import write_page
from analysis.tables import PUBLISHED, load_published, oracle_markdown, table1_frame, to_latex, to_markdown
from eagle2.results.identity_records import identity_table

log = logging.getLogger(__name__)
WANDB_NODE_ROWS = 100_000  # a W&B table larger than this is logged as a uniform sample


class Report:
    """Collects the files written, notes on what was skipped, and errors, for summary.md."""

    def __init__(self, out: Path):
        self.out = out
        self.written: list[tuple[Path, str]] = []
        self.notes: list[str] = []
        self.errors: list[str] = []
        self.frames: dict[str, pd.DataFrame] = {}

    def add(self, paths, what: str) -> None:
        for path in paths if isinstance(paths, list) else [paths]:
            self.written.append((Path(path), what))

    def csv(self, frame: pd.DataFrame, name: str, what: str) -> None:
        frame.to_csv(self.out / name, index=False)
        self.frames[name.removesuffix(".csv")] = frame
        self.add(self.out / name, what)

    def text(self, body: str, name: str, what: str) -> None:
        (self.out / name).write_text(body)
        self.add(self.out / name, what)

    def section(self, name: str, fn, *args) -> None:
        """Run one part; an unexpected error becomes an entry in summary.md, and the rest still runs."""
        try:
            fn(self, *args)
        except Exception as exc:  # noqa: BLE001 - the report goes on; the exit status says it failed
            log.error("%s failed:\n%s", name, traceback.format_exc())
            self.errors.append(f"{name}: {type(exc).__name__}: {exc}")


def _failed_cells_note(failures: pd.DataFrame) -> str:
    cells = failures[failures.scope == "cell"] if not failures.empty else failures
    if cells.empty:
        return ""
    named = "; ".join(f"{r.method} on {r.dataset} ({r.model}, T={r.temperature:g})" for r in cells.itertuples())
    return f"\nFailed cells, not in the table (errors in summary.md): {named}.\n"


def _tables(rep: Report, rows: pd.DataFrame, published: pd.DataFrame) -> None:
    if rows.empty:
        rep.notes.append("no finished rows: no tables")
        return
    table = with_cost_model(method_table(rows))
    table.insert(4, "label", table.config_hash.map(variant_labels(rows)))
    rep.csv(table, "methods.csv", "per config: tokens/s, speedup over plain, tau, time shares, cost-model prediction")
    shown = [c for c in METHOD_COLUMNS if c in table]
    if both_kinds(rows):  # eager and compiled runs: each config's speedup over each plain, beside its own kind's
        at = shown.index("speedup") + 1
        shown[at:at] = ["baseline", "speedup_eager", "speedup_compiled", "speedup_fastest"]
    rep.text(table[shown].to_markdown(index=False, floatfmt=".3f"), "methods.md",
             "per config (markdown): tokens/s, speedup, the cost model's predicted speedup, tau, round split")
    if not (rows.method == "plain").any():
        rep.notes.append("no plain rows: every speedup reads 'no baseline'")
    else:
        rep.notes += _missing_baselines(rows, table)
    if batch_scaling.has_batch_sweep(rows) and (rows.batch_size.fillna(1) == 1).any():
        rows = rows[rows.batch_size.fillna(1) == 1]
        rep.notes.append("Table 1 shows batch-1 rows only (batched rows: batch_scaling.md)")
    cells, notes = table1_frame(rows, published)
    rep.notes += notes
    if published.empty:
        rep.notes.append("no published table found: Table 1 shows ours only")
    elif not cells.empty and not (cells.source == "paper").any():
        rep.notes.append("no model with published numbers (vicuna7b, vicuna13b, llama2chat7b, llama2chat13b): "
                         "Table 1 shows ours only")
    rep.csv(cells, "table1.csv", "Table 1 numbers, one line per cell (source: ours or paper)")
    failed = _failed_cells_note(rep.frames.get("failures", pd.DataFrame()))
    rep.text(to_markdown(cells) + failed, "table1.md",
             "Table 1 (markdown): speedup / tau, Mean column, paper beside ours")
    rep.text(to_latex(cells), "table1.tex", "Table 1 (LaTeX, booktabs)")
    paths, notes = figures.speedup_bars(cells, rep.out)
    rep.notes += notes
    rep.add(paths, "speedup over plain per benchmark and method (Fig. 1 style)")


def _missing_baselines(rows: pd.DataFrame, table: pd.DataFrame) -> list[str]:
    """One note per config whose speedup reads 'no baseline', naming the plain rows it lacks."""
    notes = []
    for r in table[table.speedup.isna() & ~table.method.isin(["plain", ORACLE])].itertuples():
        g = rows[rows.config_hash == r.config_hash]
        notes.append(f"{r.model}/{r.dataset}/{r.method} ({r.dtype}, {r.config_hash}): 'no baseline': "
                     f"{missing_baseline(rows, g)}")
    return notes


def _batch_scaling(rep: Report, rows: pd.DataFrame) -> None:
    if not batch_scaling.has_batch_sweep(rows):
        rep.notes.append("no rows of two or more batch sizes: no speedup-versus-batch curve")
        return
    table = batch_scaling.scaling_table(rows)
    rep.csv(table, "batch_scaling.csv", "per method and batch size: throughput, speedup over plain at that B")
    rep.text(batch_scaling.scaling_markdown(table), "batch_scaling.md", "throughput and speedup per batch size")
    rep.add(batch_scaling.scaling_figure(table, rep.out), "throughput and speedup over batched plain against B")


def _calibration(rep: Report, nodes: pd.DataFrame) -> None:
    if nodes.empty:
        rep.notes.append("no per-node records (EAGLE / EAGLE-2 runs write them): no calibration diagram")
        return
    table = calibration(nodes)
    if table.empty:
        rep.notes.append("per-node records hold no verified node: no calibration diagram")
        return
    ece = expected_calibration_error(nodes)
    rep.csv(table, "calibration.csv", "confidence bins: mean confidence, acceptance rate, node count")
    rep.csv(acceptance_by_rank(nodes), "acceptance_by_rank.csv", "acceptance rate by sibling rank")
    rep.add(figures.calibration_diagram(table, ece, rep.out),
            "reliability diagram: confidence vs acceptance, y = x, counts (Fig. 6 style)")
    if "eagle2" not in set(table.method):
        rep.notes.append("calibration: no EAGLE-2 node records; the diagram shows the other methods")


def _positions(rep: Report, rows: pd.DataFrame) -> None:
    drafted = rows[rows.method != "plain"] if not rows.empty else rows
    if drafted.empty:
        rep.notes.append("no drafting method has rows: no per-position acceptance")
        return
    pooled = drafted.assign(dataset="all", config_hash=drafted.config_hash.map(variant_labels(rows)))
    frame = per_position_acceptance(pooled).rename(columns={"config_hash": "label"})
    if frame.empty:
        rep.notes.append("drafting rows have no decode rounds: no per-position acceptance")
        return
    rep.csv(frame, "acceptance_by_position.csv", "per draft position: P(>= d accepted), conditional rate")
    rep.add(figures.position_acceptance(frame.rename(columns={"label": "config_hash"}), rep.out),
            "acceptance by draft position, all benchmarks pooled (Fig. 5 style)")


def _oracle(rep: Report, rows: pd.DataFrame) -> None:
    frame = oracle_efficiency(rows)
    if frame.empty:
        rep.notes.append("no oracle rows (method=oracle, temperature 0) matched with other methods: "
                         "no oracle efficiency")
        return
    rep.csv(frame, "oracle_efficiency.csv", "per config: tau, the oracle's tau on the same turns, their ratio")
    rep.text(oracle_markdown(frame), "oracle_efficiency.md", "oracle efficiency (markdown): tau / oracle tau")


def _tree_budget(rep: Report, rows: pd.DataFrame) -> None:
    tb = tree_budget_table(rows) if not rows.empty else pd.DataFrame()
    if tb.empty or tb.total_tokens.astype(str).groupby([tb.model, tb.dataset, tb.temperature]).nunique().max() < 2:
        rep.notes.append("no EAGLE-2 runs over two or more total_tokens: no tree-budget curves")
        return
    rep.csv(tb, "tree_budget.csv", "EAGLE-2 speedup and tau per tree setting")
    rep.add(figures.tree_budget_curves(tb, rep.out), "speedup and tau against total_tokens")


def _identity(rep: Report, results: Path, rows: pd.DataFrame) -> None:
    table = identity_table(results, rows)
    if table.empty:
        rep.notes.append("no greedy speculative rows: no identity.csv")
        return
    rep.csv(table, "identity.csv", "per greedy config: turns identical to plain, numeric / algorithmic divergences")


def _identity_lines(rep: Report) -> list[str]:
    table = rep.frames.get("identity")
    if table is None or table.empty:
        return []
    total = {s: int(table[s].sum()) for s in ("turns", "identical", "numeric", "algorithmic", "unaudited", "no_plain")}
    line = (f"{total['turns']} greedy speculative turns: {total['identical']} identical to plain decoding, "
            f"{total['numeric']} numeric divergences, {total['algorithmic']} algorithmic, "
            f"{total['unaudited']} divergent but not audited yet (`python -m eagle2.identity RESULTS`), "
            f"{total['no_plain']} without a matched plain turn.")
    if total["algorithmic"]:
        line = "**FAILED CHECK: algorithmic divergences (see identity.csv).** " + line
    return ["## Identity at temperature 0", "", line, ""]


def _failures(rep: Report, results: Path) -> None:
    failures = load_failures(results)
    rep.frames["failures"] = failures
    if not failures.empty:
        rep.csv(failures, "failures.csv", "cells and turns that failed and have not succeeded since")


def _wandb(rep: Report, nodes: pd.DataFrame, project: str, results: Path) -> None:
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    folder = rep.out / "wandb"
    folder.mkdir(exist_ok=True)
    run = wandb.init(project=project, mode="offline", dir=str(folder),
                     name=f"report-{results.resolve().name}", job_type="report", reinit="finish_previous")
    images = {p.stem: wandb.Image(str(p)) for p, _ in rep.written if p.suffix == ".png"}
    tables = {f"table/{name}": wandb.Table(dataframe=_loggable(frame)) for name, frame in rep.frames.items()
              if not frame.empty}
    if not nodes.empty:
        sample = nodes if len(nodes) <= WANDB_NODE_ROWS else nodes.sample(WANDB_NODE_ROWS, random_state=0)
        if len(sample) < len(nodes):
            rep.notes.append(f"wandb: per-node table sampled, {len(sample)} of {len(nodes)} records")
        tables["table/nodes"] = wandb.Table(dataframe=_loggable(sample))
    run.log({**{f"figure/{k}": v for k, v in images.items()}, **tables})
    run.finish()
    rep.add(folder, f"offline W&B run (figures and tables; sync with `wandb sync {folder}/wandb/offline-run-*`)")


def _loggable(frame: pd.DataFrame) -> pd.DataFrame:
    """W&B tables take scalars: lists and dicts become text."""
    frame = frame.reset_index(drop=True).copy()
    for col in frame.columns:
        if frame[col].map(lambda v: isinstance(v, (list, dict))).any():
            frame[col] = frame[col].map(str)
    return frame


def _summary(rep: Report, results: Path, rows: pd.DataFrame, nodes: pd.DataFrame) -> str:
    lines = [f"# Report of `{results}`", "",
             f"{len(rows)} finished question turns in {rows.config_hash.nunique() if not rows.empty else 0} "
             f"configs; {len(nodes)} per-node records.", "", "## Written", ""]
    lines += [f"- `{p.relative_to(rep.out)}`: {what}" for p, what in rep.written]
    lines += ["- `summary.md`: this file", ""]
    lines += _identity_lines(rep)
    if rep.notes:
        lines += ["## Skipped or partial", ""] + [f"- {n}" for n in rep.notes] + [""]
    failures = rep.frames.get("failures", pd.DataFrame())
    lines += ["## Failures still standing", ""]
    if failures.empty:
        lines += ["None.", ""]
    else:
        shown = failures[["scope", "model", "dataset", "method", "temperature", "config_hash", "question_id", "turn",
                          "error"]]
        lines += [shown.to_markdown(index=False), ""]
    if rep.errors:
        lines += ["## Errors while writing this report", ""] + [f"- {e}" for e in rep.errors] + [""]
    return "\n".join(lines)


def build_report(results: str | Path, out: str | Path, published: str | Path = PUBLISHED, use_wandb: bool = False,
                 wandb_project: str = "eagle2") -> Report:
    results, out = Path(results), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rep = Report(out)
    rows, nodes = load_rows(results), load_nodes(results)
    unreadable = unreadable_lines(results)
    if unreadable:
        rep.notes.append(f"{len(unreadable)} unreadable line(s) (cut by a kill or a full disk; not counted; the "
                         f"next run of that config redoes those turns): {', '.join(unreadable[:10])}")
    rep.section("failures", _failures, results)
    rep.section("tables and speedup bars", _tables, rows, load_published(published))
    rep.section("calibration", _calibration, nodes)
    rep.section("per-position acceptance", _positions, rows)
    rep.section("oracle efficiency", _oracle, rows)
    rep.section("tree budget", _tree_budget, rows)
    rep.section("batch scaling", _batch_scaling, rows)
    rep.section("identity", _identity, results, rows)
    if use_wandb:
        rep.section("wandb", _wandb, nodes, wandb_project, results)
    (out / "summary.md").write_text(_summary(rep, results, rows, nodes))
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="a results folder (paths.results of the runs), searched recursively")
    ap.add_argument("--out", default="report", help="where the report goes (default: report)")
    ap.add_argument("--published", default=str(PUBLISHED), help="the paper's Table 1 (TSV)")
    ap.add_argument("--wandb", action="store_true", help="also log figures and tables to an offline W&B run")
    ap.add_argument("--wandb-project", default="eagle2")
    ap.add_argument("--page", help="also write the stamped results page here (e.g. docs/results/<cpu-kind>.md)")
    ap.add_argument("--command", default="not recorded", help="the command that produced the rows (stamped)")
    ap.add_argument("--commit", help="the commit the rows were measured at (default: this checkout's HEAD)")
    args = ap.parse_args(argv)
    if not Path(args.results).is_dir():
        ap.error(f"results folder {args.results} does not exist")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[report] %(message)s"))
    log.addHandler(handler)
    rep = build_report(args.results, args.out, args.published, args.wandb, args.wandb_project)
    print(f"[report] {len(rep.written)} files in {args.out}; see {Path(args.out) / 'summary.md'}")
    for note in rep.notes:
        print(f"[report] skipped: {note}")
    if args.page:
        rows = load_rows(args.results)
        if rows.empty:
            print(f"[report] ERROR: no finished rows under {args.results}: no page written", file=sys.stderr)
            return 1
        print(f"[report] page {write_page(rows, args.page, args.command, args.commit)}")
    for err in rep.errors:
        print(f"[report] ERROR: {err}", file=sys.stderr)
    return 1 if rep.errors else 0


if __name__ == "__main__":
    sys.exit(main())
