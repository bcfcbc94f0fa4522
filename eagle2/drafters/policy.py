"""Speculation that pays or steps aside (``method.policy=pays``): before each round, whether to draft at all.

A drafting round costs its drafting plus a verify over the tree, ``T_draft + T_verify(q)``, and yields the tokens
it accepts plus the bonus; a plain round costs ``T_verify(1)`` and yields one token per row. Before drafting, the
policy predicts both rates from the cost profile of this machine (``eagle2.drafters.budget.CostProfile``: the
target, its batch size, its compile state and kernels, the drafter's cost) and the run's own counts (per row an
exponentially weighted mean of the tokens its drafted rounds appended and of the verify lengths it paid for: its
tree, or the largest tree of the rows verified with it, which the verify is padded to), and drafts only where
drafting is predicted faster:

    draft:  sum over rows of E[tokens] / (T_draft + T_B(max q))      plain:  rows / T_B(1)

Rows verified together decide together (one verify forward, padded to the largest tree); a row drafting alone
decides for itself. The running means are bias-corrected (the first drafted rounds are averaged equally, then an
exponential mean with weight ``SMOOTHING``): one round's accepted length is a noisy draw (1 to depth + 1 tokens),
and a mean that follows single rounds too closely crosses the break-even point by chance and skips rounds that
pay. A plain round learns nothing about acceptance, so after a run of plain rounds a probe burst (``PROBE_ROUNDS``
drafted rounds: one round says little) refreshes the estimate; the gap before the next burst doubles while a burst
still finds drafting not paying (``FIRST_GAP`` up to ``LAST_GAP`` rounds) and is reset once it pays; and however the
gap grows, a burst that does not pay waits long enough for probing to cost at most ``PROBE_SHARE`` of the plain
rounds' time (``least_gap``), once the estimate rests on two bursts' drafted rounds (``SURE_ROUNDS``), not on one
burst's three noisy rounds (rows verified together count their rounds together: two rows or more have them after
one burst). A burst's cost (``burst_cost``) is what its drafted rounds take beyond the plain rounds that would
have appended their tokens, plus the catch-up of its first round: the drafter's head is fed every position the gap's
plain rounds appended (at large batch sizes a burst's first round costs two plain rounds or more). Where drafting
does not pay, probing is the policy's only cost against plain decoding, hence the small share. A row with no estimate
yet starts from its group's (below) or, alone, from the run's: every drafted round of the run's earlier requests,
pooled (``run_state``, emptied after the warm-up); the run's first request starts with a burst. A row started from
the run's estimate keeps the first gap until a burst of its own (each request explores once: one unlucky early
burst must not keep a whole run from drafting).
The decision reads nothing but the profile and the counts, so a seeded run stays reproducible.

Rows verified together probe together: the burst and its gap are the group's (a burst starts when no row of the
group is in one; every row of the group then gets the same rounds left and the same next gap). A row that joins a
refilled batch starts from its group's mean estimate and gap (worth one round of its own), not with a burst of its
own: the group's counts are the best prior for a row of the same batch, and a burst per admission (at batch 4, one
every few rounds) would keep the whole batch drafting however little it pays.

Each round's tree records the decision (``DraftTree.meta``, stored per round): ``policy_choice`` (``draft``,
``plain`` or ``probe``) and the predicted tokens per second of a drafting and of a plain round (None while a row
has no estimate). How large a drafted tree is stays the drafter's own rule (EAGLE-2's auto budget may keep no
node under this policy: ``least_budget``).

``PolicyDrafter`` wraps any drafter that only proposes trees and hears what was accepted (not one that reads the
target at its own tree nodes, ``observe_target``): every other attribute is the wrapped drafter's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from eagle2.core.tree import DraftTree
from eagle2.drafters.budget import CostProfile

POLICIES = ("auto", "pays", "always")  # method.policy: pays where a profile exists / only when predicted to pay /
# every round (the old way)


def resolved_policy(method_cfg, has_profile: bool) -> str:
    """``pays`` or ``always`` for ``method.policy``: ``auto`` (the default) is ``pays`` where the method already
    prices its rounds with a measured cost profile (an auto budget), so the policy costs no measurement of its own,
    and ``always`` elsewhere; ``pays`` then measures a profile for any method (``eagle2.bench.policy_profile``)."""
    policy = str(method_cfg.get("policy") or "always")
    return ("pays" if has_profile else "always") if policy == "auto" else policy


SMOOTHING = 0.1  # weight of the newest drafted round in a row's running estimate, once 1 / rounds is below it
FIRST_GAP, LAST_GAP = 4, 64  # plain rounds before a probe burst: doubling from FIRST_GAP while drafting does not pay
PROBE_ROUNDS = 3  # drafted rounds of a probe burst
PROBE_SHARE = 0.01  # the most that probe bursts which do not pay may add to the plain rounds' time
MAX_GAP = 4096  # the longest gap least_gap asks for (where the catch-up alone outgrows PROBE_SHARE, or nearly)
SURE_ROUNDS = 2 * PROBE_ROUNDS  # drafted rounds (a group's rows together) an estimate needs before the long gaps


@dataclass
class RowEstimate:
    """One row's running counts: tokens appended by its drafted rounds (bonus included), and the length of the verify
    they paid for (the row's tree, or with rows verified together the largest of their trees)."""

    tokens: float | None = None
    tree_size: float | None = None
    rounds: int = 0  # drafted rounds learned from
    plain_streak: int = 0  # plain rounds since the last drafted one
    gap: int = FIRST_GAP  # plain rounds before the next probe burst
    probing: int = 0  # drafted rounds left in the current probe burst
    borrowed: bool = False  # the estimate is the run's, not yet this row's own (its gap stays FIRST_GAP)

    def learn(self, appended: int, tree_size: int) -> None:
        self.rounds, self.borrowed = self.rounds + 1, False
        weight = max(SMOOTHING, 1.0 / self.rounds)  # the first rounds averaged equally (bias-corrected)
        self.tokens = appended if self.tokens is None else self.tokens + weight * (appended - self.tokens)
        self.tree_size = tree_size if self.tree_size is None else self.tree_size + weight * (tree_size - self.tree_size)

    def probe_due(self) -> bool:
        return self.tokens is None or self.probing > 0 or self.plain_streak >= self.gap


def drafting_seconds(profile: CostProfile, rows: list[RowEstimate], depth: int) -> float:
    """A drafting round's predicted seconds for ``rows`` verified together (padded to the largest running tree)."""
    q = max(math.ceil(r.tree_size - 1e-9) for r in rows)
    return profile.round_draft(depth) + profile.verify(max(q, 1))


def predicted_rates(profile: CostProfile, rows: list[RowEstimate], depth: int) -> tuple[float, float]:
    """(tokens per second of a drafting round, of a plain round) for ``rows`` verified together."""
    return sum(r.tokens for r in rows) / drafting_seconds(profile, rows, depth), len(rows) / profile.verify(1)


def join_group(rows: list[RowEstimate], prior: RowEstimate | None = None) -> None:
    """A row with no estimate, verified with rows that have one, starts from their mean and their longest gap;
    where none has one, from ``prior`` (the run's pooled estimate) if it has one."""
    known = [r for r in rows if r.tokens is not None]
    borrowed = not known
    known = known or [p for p in (prior,) if p is not None and p.tokens is not None]
    if not known:
        return
    for r in rows:
        if r.tokens is None:
            r.tokens = sum(k.tokens for k in known) / len(known)
            r.tree_size = sum(k.tree_size for k in known) / len(known)
            r.rounds = 1  # the prior counts as one round of its own
            r.gap, r.borrowed = (FIRST_GAP, True) if borrowed else (max(k.gap for k in known), False)
            if not borrowed:  # the group's schedule: its next burst comes when it would have without the new row
                r.plain_streak = max(k.plain_streak for k in known)


def start_burst(rows: list[RowEstimate]) -> None:
    """The group's probe burst starts: after a plain streak that reached a gap (a burst that did not pay), the
    group's next gap doubles; every row gets the burst's rounds and the same gap."""
    stale = any(r.plain_streak >= r.gap for r in rows if r.tokens is not None)
    gap = max(r.gap for r in rows)
    gap = max(gap, min(2 * gap, LAST_GAP)) if stale else gap
    for r in rows:
        r.probing, r.gap = PROBE_ROUNDS, gap


def burst_cost(profile: CostProfile, rows: list[RowEstimate], depth: int, gap: int) -> float:
    """Seconds a probe burst after ``gap`` plain rounds adds to the plain rounds' time: its ``PROBE_ROUNDS`` drafting
    rounds less the plain rounds that would have appended the tokens they are expected to, plus the catch-up of
    the ``gap`` positions each row appended meanwhile (measured in the profile, ``CostProfile.round_catch_up``)."""
    plain = profile.verify(1)
    lost = drafting_seconds(profile, rows, depth) - plain * sum(r.tokens for r in rows) / len(rows)
    return PROBE_ROUNDS * max(lost, 0.0) + profile.round_catch_up(gap)


def least_gap(profile: CostProfile, rows: list[RowEstimate], depth: int) -> int:
    """The fewest plain rounds G between bursts for a burst's cost (``burst_cost``: a fixed part plus the catch-up,
    growing by ``round_catch_up(2)`` with each round of the gap) to be at most ``PROBE_SHARE`` of their time,
    ``fixed + per_round * (G - 1) <= PROBE_SHARE * G * T_B(1)``; ``MAX_GAP`` where no gap up to it is long enough."""
    budget = PROBE_SHARE * profile.verify(1)  # seconds of probing each plain round may carry
    per_round, fixed = profile.round_catch_up(2), burst_cost(profile, rows, depth, 1)
    if per_round >= budget:
        return MAX_GAP
    return min(MAX_GAP, max(1, math.ceil((fixed - per_round) / (budget - per_round) - 1e-9)))


def decide(profile: CostProfile, rows: list[RowEstimate], depth: int, prior: RowEstimate | None = None) -> dict:
    """This round's choice for ``rows`` verified together, recorded as the tree's meta; updates their streaks.
    ``prior``: where a row and its group have no estimate, the run's."""
    join_group(rows, prior)
    if any(r.probe_due() for r in rows):
        choice, rates = "probe", (None, None)
        if not any(r.probing for r in rows):
            start_burst(rows)
    else:
        rates = predicted_rates(profile, rows, depth)
        choice = "draft" if rates[0] > rates[1] else "plain"
        if choice == "plain" and sum(r.rounds for r in rows) >= SURE_ROUNDS:
            floor = least_gap(profile, rows, depth)
            for r in rows:
                r.gap = r.gap if r.borrowed else max(r.gap, floor)
    for r in rows:
        r.probing = max(r.probing - 1, 0) if choice == "probe" else r.probing
        if choice == "draft":
            r.gap = FIRST_GAP
        r.plain_streak = r.plain_streak + 1 if choice == "plain" else 0
    return {"policy_choice": choice, "policy_draft_tps": rates[0], "policy_plain_tps": rates[1]}


class PolicyDrafter:
    """A drafter under ``method.policy=pays``: the wrapped drafter's trees on the rounds that pay, the root alone
    on the others (see the module's docstring)."""

    def __init__(self, inner, profile: CostProfile, depth: int = 1, run_state: dict | None = None):
        if hasattr(inner, "observe_target"):
            raise ValueError(f"method.policy=pays cannot skip the rounds of {type(inner).__name__}: it reads the "
                             "target at its own tree nodes (set method.policy=always)")
        self.inner, self.profile, self.depth = inner, profile, depth
        # the batch key, asked every round: an attribute of its own (a miss ``__getattr__`` serves costs as much as
        # the call), computed once (the inner drafter's head and tree settings, fixed for its life)
        if hasattr(inner, "batch_key"):
            key = inner.batch_key()
            self.batch_key = lambda: key
        # drafted_size: this round's verify length, if drafted (rows verified together: the largest of their trees,
        # which the verify is padded to; each row's own mean would price the padded verify too cheap)
        self.estimate, self.drafted_size = RowEstimate(), None
        # every drafted round of the run's requests, pooled: where a new request starts (None: each afresh)
        self.run = None if run_state is None else run_state.setdefault("policy", RowEstimate())

    @property
    def needs_hidden(self) -> bool:  # asked every round: not through ``__getattr__``
        return self.inner.needs_hidden

    def __getattr__(self, name):  # spans, forward_time, feature_layers, ...
        if name in ("inner", "observe_target"):  # observe_target: refused above, asked every round
            raise AttributeError(name)
        return getattr(self.inner, name)

    def start(self, prompt_ids, first_token, prompt_hidden) -> None:
        self.inner.start(prompt_ids, first_token, prompt_hidden)

    def propose(self, root: int, room: int) -> DraftTree:
        return self.propose_batch([self], [root], [room])[0]

    @classmethod
    def propose_batch(cls, drafters: list["PolicyDrafter"], roots: list[int], rooms: list[int]) -> list[DraftTree]:
        """One decision for the rows (their inner drafters of equal ``batch_key`` when more than one), then their
        inner trees, or each root alone."""
        lead = drafters[0]
        meta = decide(lead.profile, [d.estimate for d in drafters], lead.depth, lead.run)
        if meta["policy_choice"] == "plain":
            trees = [DraftTree.root_only(root) for root in roots]
        elif len(drafters) == 1:
            trees = [lead.inner.propose(roots[0], rooms[0])]
        else:
            trees = type(lead.inner).propose_batch([d.inner for d in drafters], roots, rooms)
        padded = max(len(tree) for tree in trees)
        for d, tree in zip(drafters, trees):
            tree.meta.update(meta)
            d.drafted_size = None if meta["policy_choice"] == "plain" else padded
        return trees

    def observe(self, new_tokens: list[int], hidden) -> None:
        self.inner.observe(new_tokens, hidden)
        if self.drafted_size is not None:
            self.estimate.learn(len(new_tokens), self.drafted_size)
            if self.run is not None:
                self.run.learn(len(new_tokens), self.drafted_size)
