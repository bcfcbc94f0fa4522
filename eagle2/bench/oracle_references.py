"""Builds the oracle drafter (``method=oracle``) with its look-ahead read from stored results: the
outputs of plain temperature-0 rows under ``method.reference`` (``eagle2.drafters.oracle``). It lives in
the harness because it reads the results store, which drafters never touch."""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path

from eagle2.drafters import setting_checks as checks
from eagle2.drafters.oracle import OracleDrafter
from eagle2.results.store import read_rows

log = logging.getLogger(__name__)


def reference_outputs(results: str, dtype: str) -> dict[tuple[int, ...], list[int]]:
    """prompt_ids -> output_ids of every ok plain temperature-0 row in ``dtype`` under ``results`` (a
    rows file or a folder searched recursively); of several rows for one prompt, the longest output.
    Empty when there are none (the oracle then decodes itself). Cached per state of the files."""
    path = Path(results)
    files = [path] if path.is_file() else sorted(path.rglob("*.jsonl")) if path.is_dir() else []
    if not files:
        log.warning("oracle: no rows under method.reference=%s; it decodes its look-ahead itself", results)
    return _read_references(tuple((str(f), f.stat().st_size) for f in files), dtype)


@lru_cache(maxsize=8)
def _read_references(files: tuple[tuple[str, int], ...], dtype: str) -> dict[tuple[int, ...], list[int]]:
    out: dict[tuple[int, ...], list[int]] = {}
    for row in (r for f, _ in files for r in read_rows(f)):
        if (row.get("status") == "ok" and row.get("method") == "plain" and row.get("temperature") == 0
                and row.get("dtype") == dtype and row.get("prompt_ids")):
            key = tuple(row["prompt_ids"])
            if len(row["output_ids"]) > len(out.get(key, ())):
                out[key] = list(row["output_ids"])
    return out


CHECKS = {"reference": checks.path("no stored rows: it decodes its look-ahead itself")}  # before any model loads


def build(method_cfg, target, params, generator, weights: dict) -> OracleDrafter:
    reference = method_cfg.get("reference")
    references = None
    if reference:
        references = reference_outputs(str(reference), str(target.dtype).removeprefix("torch."))
    return OracleDrafter(target, int(method_cfg.depth), references)
