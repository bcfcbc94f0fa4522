"""A machine's generated results page, ``docs/results/<kind>.md`` (``python -m analysis.report RESULTS --page``).

The page is stamped with what makes its figures reproducible: the commit, the date, the machine (CPU kind as
``eagle2.core.cpu.cpu_kind`` names it, the CPU model and its bf16-relevant flags, the device), the dtype and
kernels the rows record, and the exact command that produced the rows. Its table (per model, benchmark and
temperature: every method's turns, tokens/s, speedup over plain decoding on the same turns, tau; with eager and
compiled runs both, per dtype too, a speedup over eager plain and one over compiled plain) sits between
``<!-- headline:begin -->`` and ``<!-- headline:end -->``; ``python -m analysis.status`` copies that block
into README.md, so every figure there has this page as its source. Rows over several benchmarks also get
the paper's Table 1 layout (``analysis.tables``: speedup / tau per benchmark and their mean, the paper's
published cells beside ours), below the marked block.
"""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path

import pandas as pd

from analysis.metrics import both_kinds, method_table, variant_labels
from analysis.tables import load_published, table1_frame, title, to_markdown
from eagle2.core.cpu import cpu_kind
from eagle2.registry import method_rank

BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"
STAMP_KEYS = ("Commit", "Date", "Machine", "CPU", "Dtype", "Drafters", "Command")  # each a "- **Key**: value" line
FLAGS_SHOWN = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def git_commit(root: Path | None = None) -> str:
    """HEAD's short hash, ``-dirty`` when tracked files differ from it; ``unknown`` outside a git checkout."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    try:
        commit = git("rev-parse", "--short", "HEAD")
        return commit + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_description(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """``<model name>, <n> logical CPUs, flags: <the bf16-relevant ones present>`` (``unknown`` if unreadable)."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return "unknown"
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "unknown model")
    flags = set(next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), []))
    count = sum(ln.startswith("processor") for ln in lines)
    shown = [f for f in FLAGS_SHOWN if f in flags] or ["none of " + ", ".join(FLAGS_SHOWN)]
    return f"{model}, {count} logical CPUs, flags: {' '.join(shown)}"


def _values(rows: pd.DataFrame, column: str) -> str:
    if column not in rows:
        return "not recorded"
    return ", ".join(sorted(str(v) for v in rows[column].dropna().unique())) or "not recorded"


def _weights(rows: pd.DataFrame) -> str:
    """The drafter weights the rows used, ``key <content hash>`` (hub ids unhashed), or ``none``."""
    seen = set()
    for weights in rows.get("weights", pd.Series(dtype=object)).dropna():
        seen |= {(k, str(v)[:12] if v else "hub") for k, v in weights.items()}
    return ", ".join(f"{k} `{h}`" for k, h in sorted(seen)) or "none"


def headline_table(rows: pd.DataFrame) -> str:
    """Per model, benchmark, temperature and token limit: method, turns, tokens/s, speedup, tau (markdown).
    Rows of eager and compiled runs both: per dtype too, and two speedups, over eager plain and over the faster
    of eager and compiled plain (plain's own rows then show the one plain over the other); the labels carry the kind."""
    limits = rows.groupby("config_hash").max_new_tokens.max() if "max_new_tokens" in rows else pd.Series(dtype=int)
    table = method_table(rows).assign(limit=lambda t: t.config_hash.map(limits).fillna(-1).astype(int))
    labels, two = variant_labels(rows), both_kinds(rows)
    keys = ["model", "dataset", "temperature", "limit"] + (["dtype"] if two else [])
    speeds = ["speedup_eager", "speedup_fastest"] if two else ["speedup"]
    heads = "speedup over eager plain | over the fastest plain" if two else "speedup"
    out = []
    for key, g in table.groupby(keys):
        (model, dataset, temperature, limit), dtype = key[:4], (f", {key[4]}" if two else "")
        tokens = f", at most {limit} new tokens" if limit >= 0 else ""
        out += [f"{model}, {title(dataset)}, temperature {temperature:g}{tokens}{dtype}:", "",
                f"| method | turns | tokens/s | {heads} | tau |", "|---|---:|---:|" + "---:|" * len(speeds) + "---:|"]
        g = g.assign(rank=g.method.map(method_rank)).sort_values(["rank", "method", "compiled", "config_hash"])
        # several configs under one name: what differs names them (with both kinds, the label says the kind)
        names = g.config_hash.map(labels).fillna(g.method) if two else g.method
        many = names.duplicated(keep=False) if two else g.method.duplicated(keep=False)
        for r, several, shown in zip(g.itertuples(), many, names):
            name = f"{labels.get(r.config_hash, r.method)} ({r.config_hash})" if several else shown
            speed = " | ".join(f"{v:.2f}x" if v == v else "no baseline" for v in (getattr(r, c) for c in speeds))
            out.append(f"| {name} | {r.turns} | {r.tokens_per_s:.1f} | {speed} | {r.tau:.2f} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def machine_kinds(rows: pd.DataFrame) -> str:
    """The CPU kinds the rows were measured on (this machine's where the rows do not record one)."""
    kinds = _values(rows, "cpu_kind")
    return cpu_kind() if kinds == "not recorded" else kinds


def stamp_lines(rows: pd.DataFrame, command: str, commit: str, date: str, cpu: str) -> list[str]:
    """The ``- **Key**: value`` lines (``STAMP_KEYS``) that make a page's figures reproducible."""
    stamp = {"Commit": f"`{commit}`", "Date": date, "Machine": f"CPU kind {machine_kinds(rows)}",
             "CPU": cpu, "Dtype": f"{_values(rows, 'dtype')} (kernels: {_values(rows, 'kernels')})",
             "Drafters": _weights(rows), "Command": f"`{command}`"}
    return [f"- **{key}**: {stamp[key]}" for key in STAMP_KEYS]


def today() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")


def page_markdown(rows: pd.DataFrame, command: str, commit: str, date: str, cpu: str) -> str:
    """The page's text: title, stamp lines (``STAMP_KEYS``), the marked headline table, how to regenerate it."""
    lines = [f"# Results on a {machine_kinds(rows)} machine", "",
             "Generated by `python -m analysis.report RESULTS --page PAGE`; do not edit by hand.", ""]
    lines += stamp_lines(rows, command, commit, date, cpu)
    lines += ["", "Speedup: tokens/s over plain decoding's on the same question turns (decode time only); "
              "tau: tokens per target forward.", "", BEGIN, headline_table(rows).rstrip(), END, ""]
    if rows.dataset.nunique() > 1:  # several benchmarks: the paper's Table 1 layout too, its figures beside ours
        lines += ["## The same rows in the layout of the EAGLE-2 paper's Table 1", "",
                  to_markdown(table1_frame(rows, load_published())[0]).rstrip(), ""]
    return "\n".join(lines)


def write_page(rows: pd.DataFrame, path: str | Path, command: str, commit: str | None = None) -> Path:
    """Write ``page_markdown`` for ``rows`` to ``path``, stamped now with this checkout's commit (or ``commit``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page_markdown(rows, command, commit or git_commit(path.parent), today(), cpu_description()))
    return path


def stamp_of(page_text: str) -> dict[str, str]:
    """The stamp lines of a page's text, key -> value (missing keys absent)."""
    out = {}
    for line in page_text.splitlines():
        for key in STAMP_KEYS:
            prefix = f"- **{key}**: "
            if line.startswith(prefix):
                out[key] = line[len(prefix):].strip()
    return out


def headline_block(page_text: str) -> str:
    """The text between the page's headline markers (ValueError when they are missing)."""
    if BEGIN not in page_text or END not in page_text:
        raise ValueError(f"no {BEGIN} ... {END} block")
    return page_text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
