"""The per-round budget of EAGLE-2 with ``method.total_tokens=auto``: a pure policy over a measured
cost profile (measured by ``eagle2.bench.cost_profile``).

Each round verifies the ``m`` best drafted nodes (by path value V) that maximise the expected tokens
per second

    (1 + V_1 + ... + V_m) / (T_draft + T_verify(m + 1))

where ``1 + sum V`` estimates the tokens a round yields (the bonus token plus each node's chance of
being accepted, when V is calibrated). A profile of batched decoding (``rows`` = B > 1) measures
``T_verify`` as one forward over B rows of q tree tokens each, ``T_B(q)``, and ``T_draft`` as the drafting
of ``draft_rows`` rows: all B when the rows draft together (``eagle2.drafters.head_group``: one head forward
per step for every row), else one row, and the B rows draft one after another. A round costs
``B / draft_rows * T_draft + T_B(m + 1)``. The choice depends only on the profile and the draft, never on
live timings, so a seeded run is reproducible.

Under ``method.policy=pays`` (``eagle2.drafters.policy``) the count may be 0 (``least=0``): once drafted, a round
verifies the root alone when no node pays for its share of the verify.

Rows that draft together (batched decoding) share one budget (``best_shared_budget``): their trees are verified
in one forward, padded to the largest, so a row's budget below the others' saves nothing; the shared ``m``
maximises the rows' expected tokens together per second of the round.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CostProfile:
    verify_s: list[float]  # verify_s[q-1]: target forward over q tree tokens + LM head (made monotone)
    draft_s: list[float]  # draft_s[d-1]: one drafting round at depth d (head forwards + top-k + bookkeeping)
    context: int
    meta: dict
    rows: int = 1  # requests verified together (the batch size the profile was measured at)
    draft_rows: int = 1  # rows whose drafting one ``draft_s`` entry times (``rows`` when they draft together)
    # a drafting round's extra seconds per further pending position a row (the head fed the positions that plain
    # rounds appended, eagle2.drafters.policy; for the ``draft_rows`` that one ``draft_s`` entry times; 0: unmeasured)
    catch_up_s: float = 0.0

    def verify(self, q: int) -> float:
        """T_verify(q); beyond the measured range, extrapolated linearly from the last two points."""
        if q <= len(self.verify_s):
            return self.verify_s[q - 1]
        slope = self.verify_s[-1] - self.verify_s[-2] if len(self.verify_s) > 1 else 0.0
        return self.verify_s[-1] + slope * (q - len(self.verify_s))

    def draft(self, depth: int) -> float:
        return self.draft_s[min(depth, len(self.draft_s)) - 1]

    def round_draft(self, depth: int) -> float:
        """A round's drafting at ``depth``: every row of the batch drafts its tree (together: one ``draft_s``)."""
        return self.rows / self.draft_rows * self.draft(depth)

    def round_catch_up(self, pairs: int) -> float:
        """A round's extra drafting seconds when every row feeds ``pairs`` pending positions, not one."""
        return self.rows / self.draft_rows * self.catch_up_s * max(pairs - 1, 0)

    def round_seconds(self, depth: int, nodes: int, least: int = 1) -> torch.Tensor:
        """Predicted seconds (float64) of a round drafting at ``depth`` and verifying m + 1 tokens,
        m = least..nodes."""
        draft = self.round_draft(depth)
        return torch.tensor([draft + self.verify(m + 1) for m in range(least, nodes + 1)], dtype=torch.float64)


def best_budget(values: torch.Tensor, profile: CostProfile, depth: int, least: int = 1) -> tuple[int, float, float]:
    """For path values sorted best-first, the ``m >= least`` maximising expected tokens per second.
    Returns (m, expected tokens of the round, predicted seconds of the round)."""
    m, expected, seconds = best_shared_budget([values], profile, depth, least)
    return m, expected[0], seconds


def best_shared_budget(values: list[torch.Tensor], profile: CostProfile, depth: int,
                       least: int = 1) -> tuple[int, list[float], float]:
    """For rows verified together (each row's path values sorted best-first; a row may hold fewer), the one
    ``m >= least`` (1, or 0 under ``method.policy=pays``) maximising
    (sum over rows of 1 + V_1 + ... + V_min(m, n_b)) / (T_draft + T_B(m + 1)).
    Returns (m, each row's expected tokens, predicted seconds of the round)."""
    top = max(len(v) for v in values)
    expected = torch.stack([torch.cumsum(torch.nn.functional.pad(v.double(), (1, top - len(v))), 0) + 1.0
                            for v in values])  # (R, top + 1), column m: m nodes; beyond a row's own count: nothing
    expected = expected[:, least:]
    seconds = profile.round_seconds(depth, top, least)
    pick = int(torch.argmax(expected.sum(0) / seconds))
    return pick + least, expected[:, pick].tolist(), float(seconds[pick])
