"""The side-by-side benchmarks' library (``experiments/bench/side_by_side.py``): who runs first alternates, the
rates are tokens over each decoder's own seconds, fp32 outputs must agree; and ``build_drafter`` takes weights
only by a drafter family's key."""

from __future__ import annotations

import pytest

from eagle2.bench.methods import build_drafter
from experiments.bench import side_by_side


def test_alternating_rates_flip_the_order_every_repetition(monkeypatch):
    calls, now = [], [0.0]
    monkeypatch.setattr(side_by_side, "device_clock", lambda device: now[0])

    def decoder(name, seconds):
        def decode(prompt):
            calls.append(name)
            now[0] += seconds
            return [0] * 4
        return decode

    rates = side_by_side.alternating_rates({"a": decoder("a", 1.0), "b": decoder("b", 2.0)}, [[1], [2]], 3,
                                           echo=False)
    assert calls == ["a", "a", "b", "b", "b", "b", "a", "a", "a", "a", "b", "b"]
    assert rates == [{"a": 4.0, "b": 2.0}] * 3  # 8 tokens in 2 s and in 4 s
    assert side_by_side.ratio_line(rates, "a", "b").startswith("median ratio a/b over 3 reps: 2.000")


def test_fp32_outputs_that_differ_are_refused():
    same = side_by_side.identity_line("float32", {"x": lambda p: [1, 2], "y": lambda p: [1, 2]}, [[0], [1]])
    assert same == "outputs identical on 2/2 prompts (fp32)"
    with pytest.raises(AssertionError, match="x and y disagree in fp32 on 1 prompts"):
        side_by_side.identity_line("float32", {"x": lambda p: [1, 2], "y": lambda p: [1, p[0] + 2]}, [[0], [1]])


def test_build_drafter_names_a_keyword_that_is_no_weight_kind():
    with pytest.raises(TypeError, match="draft_model is no drafter family's key"):
        build_drafter({"name": "sps"}, None, None, None, draft_model=object())
