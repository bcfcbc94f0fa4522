"""Stored rows as pandas frames: every row under a results folder, and the plain-decoding rows a
config is compared with. Shared by the identity audit (which re-runs models) and the analysis (which never
does); it reads the store only.

Two plain baselines. A row's ``compile`` field says whether its target ran eager or through the compiled path
(``true`` / ``auto:true``; ``false``, ``auto:false`` or no field: eager), and plain decoding can be either, so
``baseline_rows`` takes which one: ``eager`` or ``compiled`` plain, or (the default) plain of the config's own
kind, like with like. Which plain run a speedup is measured against is derived here, from the rows, rather
than stored in each row as a field: a row records one measurement of one config, and its baseline is a relation
between configs that exists only once both are stored (plain may run later, or be rerun), so a stored name
could go stale or point at nothing, and the rows written before this existed would have none. ``compile`` is
already in every row that could be compiled, and an older row without it ran eager.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from eagle2.results.store import read_rows

GROUP = ["model", "dataset", "method", "temperature", "config_hash"]
BASELINES = ("eager", "compiled")  # the plain decodings a speedup can be measured against


def compiled(rows: pd.DataFrame) -> pd.Series:
    """Per row: whether its target ran through the compiled path (``compile`` ending in ``true``)."""
    if "compile" not in rows:
        return pd.Series(False, index=rows.index)
    return rows["compile"].astype(str).str.endswith("true")


def both_kinds(rows: pd.DataFrame) -> bool:
    """Whether ``rows`` hold eager and compiled rows both (then tables show a speedup over each plain)."""
    kinds = compiled(rows)
    return bool(kinds.any() and not kinds.all())


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
    if "ignore_eos" in frame:  # rows stored before the field decoded up to their stop tokens
        frame["ignore_eos"] = frame["ignore_eos"].fillna(False).astype(bool)
    if "accept_lengths" in frame:  # failed rows have none
        frame["decode_tokens"] = frame["accept_lengths"].map(lambda a: sum(a) if isinstance(a, list) else 0)
    return frame.reset_index(drop=True)


def baseline_rows(rows: pd.DataFrame, g: pd.DataFrame, baseline: str | None = None) -> pd.DataFrame:
    """Plain-decoding rows comparable with the config ``g``: same model, dataset, temperature and,
    where recorded, the same max_new_tokens, ignore_eos, seed and dtype; of several such plain configs, the one sharing
    the most question turns with ``g`` (never a pool of several). ``baseline``: ``eager`` or ``compiled``
    plain decoding (``BASELINES``); None: plain of ``g``'s own kind (in a folder of one kind, every plain)."""
    if baseline not in (None, *BASELINES):
        raise ValueError(f"baseline={baseline!r}: choose one of {BASELINES} or None")
    first = g.iloc[0]
    mask = (rows.method == "plain") & (rows.model == first.model) & (rows.dataset == first.dataset) & (
        rows.temperature == first.temperature)
    want = bool(compiled(g.iloc[:1]).iloc[0]) if baseline is None else baseline == "compiled"
    mask &= compiled(rows) == want
    for key in ("max_new_tokens", "ignore_eos", "seed", "dtype", "batch_size"):  # batched: plain at the same batch size
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
