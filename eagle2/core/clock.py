"""Round timing without host syncs: marks are CUDA events on the timed device's current stream on CUDA (not
the current device's: with ``model.device=cuda:1`` the work runs there), perf_counter on CPU.

A ``Clock``'s marks are recorded as the work is queued and read as seconds once, after the last one
(``resolve``: one wait, on the last event, per generation). ``Spans`` time repeated pieces of work (a
drafter's own forwards) the same way. ``device_clock`` (a CUDA sync, then perf_counter) is for benchmarks
that mean to wait for the device at each reading.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

Event = torch.cuda.Event  # a name tests can replace with a fake event class


def device_clock(device) -> float:
    """perf_counter after the device's queued work is done (a CUDA sync), for benchmarks that mean to wait;
    decoding rounds are timed by ``Clock`` (no syncs)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def uses_events(device) -> bool:
    """Whether work on ``device`` runs asynchronously and is timed by events (CUDA)."""
    return torch.device(device).type == "cuda"


def stream_of(device):
    """The current CUDA stream of ``device`` (where its queued work runs)."""
    return torch.cuda.current_stream(torch.device(device))


class Clock:
    """Marks in time on one device, read as seconds since the first mark once the work is done."""

    def __init__(self, device):
        self.events = uses_events(device)
        self.device = device
        self._marks: list = []
        self._seconds: list[float] | None = None

    def __len__(self) -> int:
        return len(self._marks)

    def mark(self) -> int:
        """Record a mark after the work queued so far; its index. No wait on CUDA."""
        if self.events:
            event = Event(enable_timing=True)
            event.record(stream_of(self.device))  # on the timed device's stream
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())
        self._seconds = None
        return len(self._marks) - 1

    def resolve(self, wait: bool = True) -> list[float]:
        """Seconds of every mark since the first. On CUDA, ``wait`` waits once for the last event; pass
        False only when a later mark on the same stream has already been waited for."""
        if self._seconds is None:
            if not self._marks:
                self._seconds = []
            elif self.events:
                if wait:
                    self._marks[-1].synchronize()
                first = self._marks[0]
                self._seconds = [first.elapsed_time(m) / 1e3 for m in self._marks]
            else:
                self._seconds = [m - self._marks[0] for m in self._marks]
        return self._seconds

    def between(self, start: int, end: int) -> float:
        """Seconds from mark ``start`` to mark ``end`` (resolving, hence waiting once on CUDA)."""
        seconds = self.resolve()
        return seconds[end] - seconds[start]


class Spans:
    """Durations of repeated pieces of work, e.g. a drafter's own forwards: ``with spans.span(): ...``."""

    def __init__(self, device):
        self.device = device
        self.clock = Clock(device)
        self.pairs: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return len(self.pairs)

    def clear(self) -> None:
        """Forget every span (at a generation's start, so marks do not pile up across generations)."""
        self.clock = Clock(self.device)
        self.pairs = []

    @contextmanager
    def span(self):
        start = self.clock.mark()
        yield
        self.pairs.append((start, self.clock.mark()))

    def seconds(self, first: int = 0, last: int | None = None, wait: bool = True) -> float:
        """Total seconds of spans ``first`` to ``last`` (exclusive); see ``Clock.resolve`` for ``wait``."""
        pairs = self.pairs[first:last]
        if not pairs:
            return 0.0
        marks = self.clock.resolve(wait)
        return sum(marks[end] - marks[start] for start, end in pairs)
