"""Stored rows as pandas frames: every row under a results folder, and the plain-decoding rows a
config is compared with. Shared by the identity audit (which re-runs models) and the analysis (which never
does); it reads the store only."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from eagle2.results.store import read_rows

GROUP = ["model", "dataset", "method", "temperature", "config_hash"]


def iter_rows(results: str | Path):
    """Every stored row under ``results`` (recursively), skipping a line cut by a kill."""
    for path in sorted(Path(results).rglob("*.jsonl")):
        yield from read_rows(path)


def load_rows(results: str | Path, status: str = "ok") -> pd.DataFrame:
    """Every row under ``results`` (recursively) with the given status."""
    frame = pd.DataFrame([r for r in iter_rows(results) if status is None or r.get("status") == status])
    if frame.empty:
        return frame
    frame = frame.drop_duplicates(subset=GROUP + ["question_id", "turn"], keep="last")
    if "accept_lengths" in frame:  # failed rows have none
        frame["decode_tokens"] = frame["accept_lengths"].map(lambda a: sum(a) if isinstance(a, list) else 0)
    return frame.reset_index(drop=True)


def baseline_rows(rows: pd.DataFrame, g: pd.DataFrame) -> pd.DataFrame:
    """Plain-decoding rows comparable with the config ``g``: same model, dataset, temperature and,
    where recorded, the same max_new_tokens, seed and dtype; of several such plain configs, the one sharing
    the most question turns with ``g`` (never a pool of several)."""
    first = g.iloc[0]
    mask = (rows.method == "plain") & (rows.model == first.model) & (rows.dataset == first.dataset) & (
        rows.temperature == first.temperature)
    for key in ("max_new_tokens", "seed", "dtype", "batch_size"):  # batched: plain at the same batch size
        if key in rows and pd.notna(first.get(key)):
            mask &= rows[key] == first[key]
    base = rows[mask]
    if base.config_hash.nunique() > 1:
        turns = set(zip(g.question_id, g.turn))
        shared = {h: len(turns & set(zip(b.question_id, b.turn))) for h, b in base.groupby("config_hash")}
        base = base[base.config_hash == max(shared, key=shared.get)]
    return base


def greedy_configs(rows: pd.DataFrame):
    """(config hash, its rows, the matched plain rows) for every greedy speculative config in ``rows``: the
    pairs the identity audit checks and its summary counts."""
    greedy = rows[rows.temperature == 0] if not rows.empty else rows
    for chash, g in (greedy[greedy.method != "plain"].groupby("config_hash") if not rows.empty else ()):
        yield chash, g, baseline_rows(rows, g)
