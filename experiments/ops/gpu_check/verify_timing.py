"""The gpu-check verify stage's timing: GPU time by CUDA events with the host's launches hidden, a sample of
q, and the host syncs inside the timed section counted (any one means the events timed the host).

Used by ``experiments.ops.gpu_check.stages.verify_row`` around ``eagle2.bench.cost_profile.measure_verify``.
"""

from __future__ import annotations

import math
import statistics
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

VERIFY_RATIO_MAX = 2.0
VERIFY_QS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 60, 64)  # the verify curve's sample (60: the authors' total_token)


def sampled(qs, timer):
    """A ``measure_verify`` timer that times only the q in ``qs`` (NaN elsewhere, nothing run)."""
    return lambda fn, reps, device, q: timer(fn, reps, device, q) if q in qs else math.nan


def wall_timer(fn, reps, device, q):
    """Median wall seconds (``measure_verify``'s own timing: the device synchronised at each read)."""
    from eagle2.bench.cost_profile import median_time

    return median_time(fn, reps, device)


def gpu_timer(wall: list[float]):
    """A ``measure_verify`` timer: median GPU seconds between CUDA events around the forward, queued
    behind a ``torch.cuda._sleep`` twice as long as its wall time, so the host's launches are hidden (the
    forward's inputs are on the device before the start event: ``measure_verify``)."""
    per_ms = _sleep_cycles_per_ms()

    def timer(fn, reps, device, q):
        fn()
        cycles = int(per_ms * max(2e3 * wall[q - 1], 2.0))
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(cycles)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    return timer


def timed_section_syncs(target, context: int, qs, counting) -> int:
    """The most host syncs inside ``measure_verify``'s timed section over ``qs``: any one means the GPU
    clock waited for the host there, and timed it. ``counting()`` is a context manager yielding a callable
    that returns the syncs so far (``cuda_syncs`` on CUDA; the tests use virtual devices)."""
    from eagle2.bench.cost_profile import measure_verify

    counts = []

    def timer(fn, reps, device, q):
        fn()  # warm-up
        with counting() as syncs:
            fn()
            counts.append(syncs())
        return 1.0

    measure_verify(target, context=context, max_q=max(qs), reps=1, timer=sampled(qs, timer))
    return max(counts)


@contextmanager
def cuda_syncs():
    """Implicit CUDA syncs (``torch.cuda.set_sync_debug_mode``'s warnings: reads and blocking copies)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode(1)
        try:
            yield lambda: sum("synchroniz" in str(w.message) for w in caught)
        finally:
            torch.cuda.set_sync_debug_mode(0)


def verify_ok(ratio: list[float], gpu: list[float], wall: list[float], syncs: int) -> bool:
    """The verify stage's criterion: T(max q)/T(1) in GPU time <= VERIFY_RATIO_MAX, GPU time <= 1.1 x wall
    at every q, and no host sync inside the timed section (else the events time the host)."""
    return syncs == 0 and ratio[-1] <= VERIFY_RATIO_MAX and all(g <= 1.1 * w for g, w in zip(gpu, wall))


def _sleep_cycles_per_ms() -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)  # warm-up
    start.record()
    torch.cuda._sleep(10**7)
    end.record()
    end.synchronize()
    return 10**7 / max(start.elapsed_time(end), 1e-3)


def count_syncs(run):
    """(run()'s result, implicit syncs, explicit syncs, where the implicit ones were) on CUDA."""
    explicit, real_sync = [0], torch.cuda.synchronize

    def counted_sync(device=None):  # explicit syncs, counted apart from the implicit ones
        explicit[0] += 1
        torch.cuda.set_sync_debug_mode(0)
        real_sync(device)
        torch.cuda.set_sync_debug_mode(1)

    torch.cuda.synchronize = counted_sync
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode(1)
            out = run()
    finally:
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize = real_sync
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    return out, len(syncs), explicit[0], sorted({f"{Path(w.filename).name}:{w.lineno}" for w in syncs})
