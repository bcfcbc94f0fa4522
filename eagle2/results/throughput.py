"""Throughput of a set of result rows as a server sees it: all new tokens over the wall time they took.

Pure Python over row dicts (no pandas, no torch), so the runner's summary and the report share it.
Rows decoded in a batch (``batch_size`` > 1) ran at the same time: their wall time is the union of their
spans ``[batch_run_start + batch_admitted_at, batch_run_start + batch_retired_at]`` (prefill included), so
continuous batching's overlapping rows and a rerun's second batch are both counted once. Rows decoded
one at a time (batch 1, or older batched rows without those fields) ran back to back: their wall time is
the sum of ``prefill_time_s + wall_time_s``.
"""

from __future__ import annotations


def _number(value) -> float | None:
    """None for a missing value (None, or NaN as pandas fills it)."""
    return None if value is None or value != value else float(value)


def row_span(row: dict) -> tuple[float, float] | None:
    """A batched row's (start, end) in Unix seconds, or None when the row has no batch times."""
    start, a, r = (_number(row.get(k)) for k in ("batch_run_start", "batch_admitted_at", "batch_retired_at"))
    if start is None or a is None or r is None:
        return None
    return start + a, start + r


def union_length(spans: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(spans):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def wall_span(rows: list[dict]) -> float:
    """Seconds the rows took together: the union of the batched rows' spans plus the others' own times."""
    spans = [s for s in map(row_span, rows) if s is not None]
    alone = sum((_number(r.get("prefill_time_s")) or 0.0) + r["wall_time_s"] for r in rows if row_span(r) is None)
    return union_length(spans) + alone


def batch_throughput(rows: list[dict]) -> dict:
    """``throughput_tokens_per_s``: all new tokens over ``wall_span``; ``request_tokens_per_s``: the mean of
    each row's own decode rate; ``mean_latency_s``: a request's mean prefill + decode time."""
    rows = [r for r in rows if r.get("status", "ok") == "ok"]
    if not rows:
        return {"throughput_tokens_per_s": None, "wall_span_s": 0.0, "request_tokens_per_s": None,
                "mean_latency_s": None}
    span = wall_span(rows)
    latency = [(_number(r.get("prefill_time_s")) or 0.0) + r["wall_time_s"] for r in rows]
    rates = [v for v in (_number(r.get("tokens_per_s")) for r in rows) if v is not None]
    return {"throughput_tokens_per_s": sum(r["new_tokens"] for r in rows) / span if span > 0 else None,
            "wall_span_s": span, "request_tokens_per_s": sum(rates) / len(rates) if rates else None,
            "mean_latency_s": sum(latency) / len(latency)}
