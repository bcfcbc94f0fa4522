"""One served request's times and a rate's figures from them (``experiment=serving``, ``eagle2.bench.serving``):
time to first token, time per output token, end-to-end latency; throughput, percentiles and goodput. Plain
Python, read by the harness that times requests and by the analysis that reads their rows."""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass
class Timing:
    """One request's times, in seconds from the run's start."""

    arrival: float
    admitted: float | None = None  # its prefill began
    first_token: float | None = None  # its prefill ended (the first token)
    finished: float | None = None
    tokens: int = 0

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first (None for a one-token answer)."""
        return (self.finished - self.first_token) / (self.tokens - 1) if self.tokens > 1 else None

    @property
    def e2e(self) -> float:
        return self.finished - self.arrival

    def record(self) -> dict:
        return {"arrival_s": self.arrival, "admitted_s": self.admitted, "first_token_s": self.first_token,
                "finished_s": self.finished, "ttft_s": self.ttft, "tpot_s": self.tpot, "e2e_s": self.e2e}


def percentile(values: list[float], p: float) -> float | None:
    """The p-th percentile (0..100), linear between order statistics; None for no values."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[min(max(int(round(p)), 1), 99) - 1]


def summarize(timings: list[Timing], slo: dict[str, float]) -> dict:
    """A rate's figures: throughput (output tokens / span from the first arrival to the last finish), requests
    per second, p50/p90/p99 of TTFT, TPOT and end-to-end latency, and goodput: the requests per second that met
    every objective of ``slo`` (``ttft_s``, ``tpot_s``, ``e2e_s``: upper bounds)."""
    done = [t for t in timings if t.finished is not None]
    if not done:
        return {"requests": 0}
    span = max(t.finished for t in done) - min(t.arrival for t in done)
    out = {"requests": len(done), "span_s": span, "throughput_tokens_per_s": sum(t.tokens for t in done) / span,
           "requests_per_s": len(done) / span}
    for name in ("ttft", "tpot", "e2e"):
        values = [v for v in (getattr(t, name) for t in done) if v is not None]
        for p in (50, 90, 99):
            out[f"{name}_p{p}_s"] = percentile(values, p)

    def met(t: Timing) -> bool:
        return all(getattr(t, key[:-2]) is None or getattr(t, key[:-2]) <= bound for key, bound in slo.items())

    out["goodput_requests_per_s"] = sum(met(t) for t in done) / span
    return out
