"""Where the identity audit's records live, how they are read and summarised: one JSON line per audited
question turn, ``<method>-<hash>.identity.ndjson`` beside the rows file, which the audit
(``eagle2.bench.identity``, which loads the target) writes; ``identity_table`` summarises them with the rows
(for ``python -m eagle2.identity`` and the report) and never runs a model. A turn is ``identical`` when its
output equals the matched plain turn's, ``numeric`` or ``algorithmic`` as its audit record says,
``unaudited`` when it differs and has no record yet, and ``no_plain`` when no matched plain turn exists
(same model, dataset, dtype, seed, max_new_tokens, temperature 0)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from eagle2.results.frames import greedy_configs, load_rows
from eagle2.results.labels import variant_labels
from eagle2.results.store import read_rows

RECORD_SUFFIX = ".identity.ndjson"


def records_path(rows_file: Path) -> Path:
    """Where the audit records of a rows file go."""
    return rows_file.with_name(rows_file.name.removesuffix(".jsonl") + RECORD_SUFFIX)


def read_records(path: Path) -> list[dict]:
    """The audit records of one file (a line cut by a kill is skipped: that turn is audited again)."""
    return read_rows(path)


def load_audit_records(results: str | Path) -> list[dict]:
    """Every audit record under ``results`` (recursively)."""
    return [r for p in sorted(Path(results).rglob(f"*{RECORD_SUFFIX}")) for r in read_records(p)]


STATUSES = ("identical", "numeric", "algorithmic", "unaudited", "no_plain")
COLUMNS = ["model", "dataset", "method", "label", "config_hash", "dtype", "turns", *STATUSES, "median_first_divergence"]


def _turn_status(row: dict, plain: dict | None, record: dict | None) -> str:
    if plain is None:
        return "no_plain"
    if record is not None:
        return record["status"]
    same_prompt = row.get("prompt_ids") == plain.get("prompt_ids") if isinstance(row.get("prompt_ids"), list) else True
    return "identical" if same_prompt and list(row["output_ids"]) == list(plain["output_ids"]) else "unaudited"


def identity_table(results: str | Path, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """One line per greedy speculative config: how many turns are identical / numeric / algorithmic."""
    rows = load_rows(results) if rows is None else rows
    if rows.empty or "output_ids" not in rows:
        return pd.DataFrame(columns=COLUMNS)
    records = {(r["config_hash"], r["question_id"], r["turn"], r.get("plain_config_hash")): r
               for r in load_audit_records(results)}
    labels = variant_labels(rows)  # tells apart configs of one method (e.g. total_tokens=8 vs auto)
    out = []
    for chash, g, base in greedy_configs(rows):
        plain_hash = base.config_hash.iloc[0] if not base.empty else None
        plain = {(q, t): r for q, t, r in zip(base.question_id, base.turn, base.to_dict("records"))}
        counts = dict.fromkeys(STATUSES, 0)
        divergences = []
        for row in g.to_dict("records"):
            key = (row["question_id"], row["turn"])
            record = records.get((chash, *key, plain_hash))
            counts[_turn_status(row, plain.get(key), record)] += 1
            if record is not None and record.get("first_divergence") is not None:
                divergences.append(record["first_divergence"])
        first = g.iloc[0]
        out.append({"model": first.model, "dataset": first.dataset, "method": first.method,
                    "label": labels.get(chash, first.method), "config_hash": chash,
                    "dtype": first.get("dtype") if pd.notna(first.get("dtype")) else "unknown", "turns": len(g),
                    **counts, "median_first_divergence": float(pd.Series(divergences).median())
                    if divergences else float("nan")})
    return pd.DataFrame(out, columns=COLUMNS)
