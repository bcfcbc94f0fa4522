"""An open-loop server over the batch engine: requests arrive on their own schedule, not when a row frees.

Arrivals are a seeded Poisson process (``poisson_arrivals``: the same seed gives the same gaps, scaled to the
rate), so every method at one rate sees the same arrival pattern. ``serve`` admits each request that has arrived
into a free row (continuous batching, at most B rows), runs the batch's rounds while any row is live, and waits
for the next arrival when none is. Per request it keeps the times that serving benchmarks report (``Timing``,
``eagle2.results.serving_stats``): time to first token (arrival to the end of its prefill, which yields the
first token; queueing included), time per output token after the first, and end-to-end latency; ``summarize``
there turns them into a rate's throughput, p50/p90/p99 latencies and goodput under a latency objective.

The rows it drives are anything with ``admit(slot, request)``, ``round()``, ``finished(slot)`` and ``retire(slot)``
(``EngineRows``: the batch engine's own steps), and the clock anything with ``now()`` and ``wait_until(t)``
(``WallClock``), so the bookkeeping is tested on a fake clock.
"""

from __future__ import annotations

import random
import time
from collections import deque

from eagle2.core.clock import device_clock
from eagle2.results.serving_stats import Timing


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Arrival times (seconds from the start) of ``n`` requests at ``rate`` per second: exponential gaps drawn
    at rate 1 from ``seed`` and scaled, so one seed is one pattern at every rate."""
    if rate <= 0:
        raise ValueError(f"the arrival rate must be > 0, not {rate}")
    draw, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        t += draw.expovariate(1.0)
        out.append(t / rate)
    return out


class WallClock:
    """Seconds since the server started, read after the device's queued work (``device_clock``)."""

    def __init__(self, device="cpu"):
        self.device = device
        self.zero = device_clock(device)

    def now(self) -> float:
        return device_clock(self.device) - self.zero

    def wait_until(self, t: float) -> None:
        time.sleep(max(0.0, t - self.now()))


def serve(rows, requests: list, arrivals: list[float], batch_size: int, clock, on_finish) -> None:
    """Serve ``requests`` arriving at ``arrivals`` (seconds, ascending) in at most ``batch_size`` rows;
    ``on_finish(request, timing, output)`` for each as it leaves its row (output None: it failed to start)."""
    pending = deque(sorted(zip(arrivals, range(len(requests)))))
    live: dict[int, tuple] = {}  # slot -> (request, timing)

    def retire_finished() -> None:
        for slot in [s for s in live if rows.finished(s)]:
            request, timing = live.pop(slot)
            output = rows.retire(slot)
            timing.finished, timing.tokens = clock.now(), len(output.output_ids)
            on_finish(request, timing, output)

    while pending or live:
        free = [s for s in range(batch_size) if s not in live]
        while free and pending and pending[0][0] <= clock.now():
            arrival, i = pending.popleft()
            timing, slot = Timing(arrival, admitted=clock.now()), free[0]
            try:
                rows.admit(slot, requests[i])
            except (ValueError, RuntimeError):  # a prompt that does not fit: it never holds a row
                on_finish(requests[i], timing, None)
                continue
            timing.first_token = clock.now()
            live[slot] = (requests[i], timing)
            free.pop(0)
        retire_finished()
        if not live:
            if pending:
                clock.wait_until(pending[0][0])
            continue
        rows.round()
        retire_finished()


class EngineRows:
    """The batch engine's rows, driven one step at a time (``eagle2.core.batch_engine.BatchEngine``'s own
    admission, round and finish test)."""

    def __init__(self, engine):
        from eagle2.core.batch_cache import BatchCache

        self.engine, self.cache, self.live = engine, BatchCache(engine.target, engine.rows), {}

    def admit(self, slot: int, request) -> None:
        try:
            self.live[slot] = self.engine._admit(request, slot, self.cache)
        except BaseException:
            self.cache.free(slot)
            raise

    def close(self) -> None:
        if self.engine.tap is not None:
            self.engine.tap.close()
            self.engine.tap, self.engine._tap_layers = None, None

    def round(self) -> None:
        self.engine._round(self.live, self.cache)

    def finished(self, slot: int) -> bool:
        return self.engine._finished(self.live[slot], self.cache.lengths[slot])

    def retire(self, slot: int):
        from eagle2.core.clock import device_clock

        row = self.live.pop(slot)
        row.end = device_clock(self.engine.device)
        self.cache.free(slot)
        return self.engine._output(row)
