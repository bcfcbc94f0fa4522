"""The data-scaling trend of a learning curve: a least-squares line of held-out top-1 against log2(tokens
trained) over a run's last validations, read as the gain per doubling of the tokens, the value the line
reaches at a token count, and the tokens at which it would reach a goal. A line fitted to a curve is a trend,
not a measurement: it says where the run is heading if it keeps its recent pace (a learning rate that anneals
or a corpus seen twice can bend it either way), which is what deciding how long to train needs.

    python -m analysis.learning_curve "EAGLE-3=RUN@eagle3/top1" --out c.png --trend 8 --project 20e6 --goal 0.55
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Trend:
    """``value = intercept + per_doubling * log2(tokens)``, fitted to ``points`` validations up to ``last_tokens``."""

    per_doubling: float
    intercept: float
    points: int
    last_tokens: float
    last_value: float

    def at(self, tokens: float) -> float:
        """The line's value at ``tokens`` tokens trained."""
        return self.intercept + self.per_doubling * math.log2(tokens)

    def tokens_for(self, goal: float) -> float | None:
        """The tokens trained at which the line reaches ``goal`` (None where it never does: flat or falling)."""
        if self.per_doubling <= 0:
            return None
        return 2.0 ** ((goal - self.intercept) / self.per_doubling)

    def gain_over(self, tokens: float) -> float:
        """What the line gains over the next ``tokens`` tokens after its last validation."""
        return self.at(self.last_tokens + tokens) - self.at(self.last_tokens)


def fit_trend(rows: list[dict], key: str = "top1", last: int = 8) -> Trend:
    """The trend of ``key`` over the last ``last`` validation rows that record ``tokens_trained`` (at least 3)."""
    points = [(r["tokens_trained"], r[key]) for r in rows if r.get("tokens_trained") and key in r][-last:]
    if len(points) < 3:
        raise ValueError(f"a trend needs at least 3 validations with tokens_trained and {key}; "
                         f"the run has {len(points)}")
    xs = [math.log2(t) for t, _ in points]
    ys = [v for _, v in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("a trend needs validations at more than one token count")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return Trend(slope, my - slope * mx, len(points), points[-1][0], points[-1][1])


def trend_table(runs: dict[str, list[dict]], key: str = "top1", last: int = 8, project: float | None = None,
                goal: float | None = None, window: float = 4e6) -> str:
    """A markdown table: each run's last value, its gain per doubling of tokens and over the next ``window``
    tokens, and (when asked) its value at ``project`` tokens and the tokens it needs to reach ``goal``."""
    head = ["run", "validations fitted", "last tokens", f"last {key}", "per doubling",
            f"next {window / 1e6:g}M tokens"]
    head += [f"at {project / 1e6:g}M"] if project else []
    head += [f"tokens to {goal:g}"] if goal is not None else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rows in runs.items():
        t = fit_trend(rows, key, last)
        cells = [name, str(t.points), f"{t.last_tokens / 1e6:.2f}M", f"{t.last_value:.3f}", f"{t.per_doubling:+.4f}",
                 f"{t.gain_over(window):+.4f}"]
        cells += [f"{t.at(project):.3f}"] if project else []
        if goal is not None:
            needed = t.tokens_for(goal)
            cells.append("never (not rising)" if needed is None else f"{needed / 1e6:,.0f}M")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
