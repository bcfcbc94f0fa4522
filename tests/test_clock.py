"""Round timing adds no host syncs: marks are events, read once per generation.

The CUDA path is exercised on the CPU: ``eagle2.core.clock`` is told the device runs asynchronously and
given a fake event class (a perf_counter reading at ``record``, a counted ``synchronize``), and
``torch.cuda.synchronize`` is counted. EAGLE-2, SpS and Medusa generations on tiny random models then make
no synchronize at all and one event wait per generation, and their round splits stay consistent. Negative
control: a clock whose marks synchronise the device first (the old ``device_clock``) is caught.
"""

from __future__ import annotations

import time

import pytest
import torch

import eagle2.core.clock as clock
from eagle2.core.engine import generate
from eagle2.core.sampling import SamplingParams
from eagle2.drafters.eagle2_dynamic import Eagle2Drafter
from eagle2.drafters.medusa import MedusaDrafter
from eagle2.drafters.sps import SpsDrafter
from tests.conftest import tiny_head, tiny_llama
from tests.test_medusa import TREE, tiny_medusa


class Counts:
    synchronize = 0  # torch.cuda.synchronize calls
    waits = 0  # event waits (FakeEvent.synchronize)


class FakeEvent:
    """A CUDA event's interface over perf_counter: ``record`` reads the time, ``synchronize`` is counted."""

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        self.at = None

    def record(self, stream=None):
        self.at, self.stream = time.perf_counter(), stream

    def synchronize(self):
        Counts.waits += 1

    def elapsed_time(self, end) -> float:
        assert self.at is not None and end.at is not None, "elapsed_time of an event never recorded"
        return (end.at - self.at) * 1e3


class SyncingEvent(FakeEvent):
    """Negative control: the old clock, a device synchronize before every reading."""

    def record(self, stream=None):
        torch.cuda.synchronize()
        super().record(stream)


@pytest.fixture
def fake_cuda(monkeypatch):
    Counts.synchronize = Counts.waits = 0
    monkeypatch.setattr(clock, "uses_events", lambda device: True)
    monkeypatch.setattr(clock, "Event", FakeEvent)
    monkeypatch.setattr(clock, "stream_of", lambda device: f"stream of {device}")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: setattr(Counts, "synchronize",
                                                                            Counts.synchronize + 1))
    return monkeypatch


def eagle2(target):
    return Eagle2Drafter(tiny_head(target, seed=1), target.lm_head, "cpu", depth=3, top_k=4, total_tokens=10)


def sps(target):
    return SpsDrafter(tiny_llama(vocab=64, layers=1, seed=2, scale=3.0), SamplingParams(), 4, None)


def medusa(target):
    return MedusaDrafter(tiny_medusa(target), "cpu", choices=TREE)


DRAFTERS = {"eagle2": eagle2, "sps": sps, "medusa": medusa}


def generations(drafter_of, n: int = 2):
    target = tiny_llama(vocab=64, layers=2, seed=0, scale=3.0)
    drafter = drafter_of(target)
    return [generate(target, drafter, prompt, SamplingParams(), 24, set()) for prompt in ([3, 4, 5, 6], [7, 1])[:n]]


@pytest.mark.parametrize("name", DRAFTERS)
def test_rounds_make_no_synchronize_and_one_wait_per_generation(fake_cuda, name):
    outs = generations(DRAFTERS[name])
    assert all(len(out.rounds) > 3 for out in outs)
    assert Counts.synchronize == 0
    assert Counts.waits == len(outs)


@pytest.mark.parametrize("name", DRAFTERS)
def test_event_timed_round_split_is_consistent(fake_cuda, name):
    (out,) = generations(DRAFTERS[name], n=1)
    for r in out.rounds:
        assert 0 < r.draft_forward_s <= r.draft_time_s
        assert r.verify_forward_s > 0 and r.other_s > 0
    spent = sum(r.draft_time_s + r.verify_forward_s + r.other_s - (r.draft_time_s - r.draft_forward_s)
                for r in out.rounds)
    assert 0 < spent <= out.wall_time_s and out.prefill_time_s > 0


def test_the_count_catches_a_syncing_clock(fake_cuda):
    """Negative control: marks that synchronise the device (the old ``device_clock``) are counted."""
    fake_cuda.setattr(clock, "Event", SyncingEvent)
    (out,) = generations(eagle2, n=1)
    assert Counts.synchronize > 10 * len(out.rounds)


def test_cpu_clock_reads_perf_counter_without_events(monkeypatch):
    monkeypatch.setattr(clock, "Event", None)  # never touched on the CPU
    c = clock.Clock("cpu")
    a = c.mark()
    time.sleep(0.01)
    b = c.mark()
    assert 0.009 < c.between(a, b) < 1.0
    spans = clock.Spans("cpu")
    with spans.span():
        time.sleep(0.01)
    with spans.span():
        pass
    assert len(spans) == 2 and 0.009 < spans.seconds() < 1.0 and spans.seconds(1) < 0.009


def test_marks_are_recorded_on_the_timed_devices_stream(monkeypatch):
    """``model.device=cuda:1``: the events go on cuda:1's stream, not the current device's (cuda:0)."""
    streams = {}
    monkeypatch.setattr(clock, "uses_events", lambda device: True)
    monkeypatch.setattr(clock, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: streams.setdefault(str(device), object()))
    timer = clock.Clock("cuda:1")
    timer.mark()
    assert timer._marks[0].stream is streams["cuda:1"]
