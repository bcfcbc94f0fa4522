"""The data-scaling trend (analysis.trend): on validations that lie on a known line of top-1 against log2(tokens),
the fit returns that line, its value at a token count, the tokens for a goal and the gain over a window; a falling
curve never reaches a goal; too few validations are refused in one line."""

from __future__ import annotations

import math

import pytest

from analysis.trend import fit_trend, trend_table


def rows_on_line(intercept: float, slope: float, tokens: list[float]) -> list[dict]:
    return [{"tokens_trained": t, "top1": intercept + slope * math.log2(t)} for t in tokens]


def test_the_fit_recovers_a_known_line():
    rows = [{"tokens_trained": 0, "top1": 0.9}]  # a row without tokens is left out of the fit
    rows += rows_on_line(-0.5, 0.04, [1e6 * 2**k for k in range(10)])
    t = fit_trend(rows, last=5)
    assert t.points == 5 and t.per_doubling == pytest.approx(0.04)
    assert t.at(2 ** 30) == pytest.approx(-0.5 + 0.04 * 30)
    assert t.tokens_for(0.5) == pytest.approx(2 ** 25)
    assert t.gain_over(t.last_tokens) == pytest.approx(0.04)  # doubling the last tokens gains one slope
    assert t.last_value == pytest.approx(rows[-1]["top1"])


def test_a_falling_curve_never_reaches_its_goal():
    t = fit_trend(rows_on_line(1.0, -0.01, [1e6, 2e6, 4e6, 8e6]))
    assert t.per_doubling < 0 and t.tokens_for(0.99) is None
    assert "never" in trend_table({"run": rows_on_line(1.0, -0.01, [1e6, 2e6, 4e6])}, goal=0.99)


def test_the_table_and_too_few_points():
    table = trend_table({"A": rows_on_line(0.0, 0.05, [2**20, 2**21, 2**22])}, project=2**24, goal=1.1)
    assert "+0.0500" in table and "| 1.200 |" in table and "| 4M |" in table  # 2**22 tokens to reach 1.1
    with pytest.raises(ValueError, match="at least 3"):
        fit_trend(rows_on_line(0.0, 0.05, [1e6, 2e6]))
