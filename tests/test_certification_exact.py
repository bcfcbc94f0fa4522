"""Exact losslessness at temperature > 0: one real decoding round, every random outcome enumerated.

The chi-square certification (``test_certification.py``) samples, so it cannot see a small bias. Here
nothing is sampled. With the same tiny 8-token target, draft and head, the context is fixed (the
prompt plus a fixed first token) and one round runs through the real engine (``engine.generate``:
the drafter's proposal, the tree's mask, position ids and cache, the target's verify forward). Every
random draw goes through an injectable ``Draws`` (``eagle2.core.sampling``): ``ReplayDraws`` answers a
fixed list of decisions and stops at the first undecided one, so a depth-first search over decision
prefixes enumerates every outcome with its exact probability — first the drafter's own choices (SpS's
sampled chain; EAGLE's deterministic trees give one outcome), then, for each drafted tree, every
acceptance outcome of the production ``accept_stochastic``. Each round's emitted tokens are extended
to a window of W = max draft depth + 1 tokens with the target's exact conditionals (temperature, top-k
and top-p applied by the independent float64 reference ``tests/sampling_reference.py``, not by the
``probabilities()`` under test) and the result is
compared with the target's exact joint distribution over W tokens (float64 sums; pass when the max
abs difference < 1e-5). Since W covers every drafted token and the bonus, a bonus token after a fully
accepted draft is inside the window (asserted to have positive probability). Deliberately broken
rules run through the very same check and must be rejected by a wide margin (> 1e-3).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch
from omegaconf import OmegaConf

import eagle2.core.engine as engine
import tests.test_certification as cert
from eagle2.bench.methods import build_drafter
from eagle2.core.accept import accept_stochastic
from eagle2.core.sampling import Draws, SamplingParams, probabilities
from eagle2.core.tree import DraftTree
from eagle2.drafters.sps import SpsDrafter
from tests.conftest import shared_drafter_weights
from tests.sampling_reference import reference_for

pytestmark = pytest.mark.usefixtures("synthetic_cost_profile")  # auto budgets independent of machine load

VOCAB, PROMPT, PARAMS = cert.VOCAB, cert.PROMPT, cert.PARAMS
METHODS = {**cert.METHODS,  # and P-EAGLE: two depths from one forward, a top-2 tree (a random head per target)
           "peagle": {"name": "peagle", "depth": 2, "top_k": 2, "total_tokens": 4},
           # and DFlash: a block of 3 (two depths) from one forward, a top-2 tree (a random draft model per target)
           "dflash": {"name": "dflash", "block_size": 3, "top_k": 2, "total_tokens": 4},
           "pard": {"name": "pard", "depth": 2, "top_k": 2, "total_tokens": 4}}  # PARD: two depths from one forward
# the fixed first tokens: each context PROMPT + [first] is checked; 2 and 3 are the target's likely
# first tokens, after 6 SpS drafts and after 7 EAGLE trees are most often fully accepted
CONTEXTS = (2, 3, 6, 7)
W = 3  # the window: max draft depth of METHODS (2) + 1
PASS_DIFF, REJECT_DIFF, MIN_FULL = 1e-5, 1e-3, 5e-3
models = cert.models  # the module-scoped fixture: tiny target, SpS draft, EAGLE head


# ---- exact enumeration of random draws ----

class Branch(Exception):
    """Raised at the first undecided draw: its (decision, probability) options."""

    def __init__(self, options: list[tuple[object, float]]):
        super().__init__(options)
        self.options = options


class ReplayDraws:
    """Draws answering from ``decisions`` in order; the first draw beyond them raises ``Branch``."""

    def __init__(self, decisions: list):
        self.decisions, self.used = decisions, 0

    def _decide(self, options: list[tuple[object, float]]):
        if self.used == len(self.decisions):
            raise Branch([(d, p) for d, p in options if p > 0])
        self.used += 1
        return self.decisions[self.used - 1]

    def accept(self, numerator: float, denominator: float = 1.0) -> bool:
        p = min(1.0, max(0.0, numerator / denominator)) if denominator > 0 else 0.0
        return self._decide([(True, p), (False, 1.0 - p)])

    def categorical(self, probs: torch.Tensor) -> int:
        probs = probs.double() / probs.double().sum()
        return self._decide(list(enumerate(probs.tolist())))


def enumerate_outcomes(run) -> list[tuple[object, float]]:
    """Every (result of ``run(draws)``, probability), depth-first over decision prefixes."""
    done, todo = [], [([], 1.0)]
    while todo:
        decisions, prob = todo.pop()
        try:
            done.append((run(ReplayDraws(decisions)), prob))
        except Branch as branch:
            todo.extend((decisions + [d], prob * p) for d, p in branch.options)
    return done


# ---- one real round, then the window ----

def drafted_rounds(models, method: dict, params: SamplingParams, first: int) -> list[tuple[tuple, float]]:
    """Every ((tree, p_target), probability) of one engine round after PROMPT + [first]: the drafter
    draws through ReplayDraws, the engine verifies, acceptance is captured instead of run."""
    target, draft, head = models
    cfg, captured, weights = OmegaConf.create(method), [], shared_drafter_weights(target, method)

    def capture(tree, p_target, generator):
        captured.append((tree, p_target))
        return [], 0

    def run(draws):
        drafter = build_drafter(cfg, target, params, draws, head=head, sps_draft=draft,
                                weights=weights)
        engine.generate(target, drafter, PROMPT, params, 2, set(), None)
        return captured.pop()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "next_token", lambda *args: first)
        mp.setattr(engine, "accept_stochastic", capture)
        return enumerate_outcomes(run)


def emitted_outcomes(tree: DraftTree, p_target: torch.Tensor, accept) -> list[tuple[tuple, bool, float]]:
    """Every (emitted tokens, fully accepted?, probability) of ``accept`` on a verified tree."""
    def run(draws):
        path, bonus = accept(tree, p_target, draws)
        full = bool(path) and not tree.children[path[-1]]
        return tuple(int(tree.tokens[i]) for i in path) + (bonus,), full

    return [(emitted, full, p) for (emitted, full), p in enumerate_outcomes(run)]


class Completions:
    """The target's exact conditionals after ``context``: P(rest of the window | emitted prefix)."""

    def __init__(self, target, params: SamplingParams, context: list[int]):
        self.cond, prefixes = {}, [()]
        with torch.no_grad():
            for _ in range(W):
                ids = torch.tensor([context + list(s) for s in prefixes])
                self.cond.update(zip(prefixes, reference_for(target(ids).logits[:, -1], params)))  # independent
                prefixes = [s + (v,) for s in prefixes for v in range(VOCAB)]
        self.memo = {}

    def __call__(self, prefix: tuple) -> torch.Tensor:
        """(VOCAB ** (W - len(prefix)),) probabilities of every completion, flattened; () gives the
        target's joint distribution of the window."""
        if len(prefix) == W:
            return torch.ones(1, dtype=torch.float64)
        if prefix not in self.memo:
            p = self.cond[prefix]
            self.memo[prefix] = torch.cat([p[v] * self(prefix + (v,)) for v in range(VOCAB)])
        return self.memo[prefix]


def window_distribution(rounds, accept, complete: Completions) -> tuple[torch.Tensor, float]:
    """(P(window) over VOCAB ** W outcomes from the enumerated rounds, P(bonus after full acceptance))."""
    emitted: dict[tuple, float] = {}
    full_prob = 0.0
    for (tree, p_target), p_tree in rounds:
        for tokens, full, p in emitted_outcomes(tree, p_target, accept):
            emitted[tokens] = emitted.get(tokens, 0.0) + p_tree * p
            full_prob += p_tree * p * full
    dist = torch.zeros(VOCAB**W, dtype=torch.float64)
    for tokens, p in emitted.items():
        size = VOCAB ** (W - len(tokens))
        start = sum(t * VOCAB ** (len(tokens) - 1 - i) for i, t in enumerate(tokens)) * size
        dist[start: start + size] += p * complete(tokens)
    return dist, full_prob


class ExactCheck:
    """The exact check over every context PROMPT + [first], first in CONTEXTS, with caches: the
    target's completions per (params, first) and, unless ``fresh`` (drafting or verification
    patched), the enumerated rounds per (method, params, first)."""

    def __init__(self, models):
        self.models, self.completions, self.rounds = models, {}, {}

    def _completions(self, params: SamplingParams, first: int) -> Completions:
        if (params, first) not in self.completions:
            self.completions[params, first] = Completions(self.models[0], params, PROMPT + [first])
        return self.completions[params, first]

    def _rounds(self, method: dict, params: SamplingParams, first: int, fresh: bool):
        key = (repr(sorted(method.items())), params, first)
        if fresh or key not in self.rounds:
            rounds = drafted_rounds(self.models, method, params, first)
            if fresh:
                return rounds
            self.rounds[key] = rounds
        return self.rounds[key]

    def __call__(self, method: dict, params: SamplingParams, accept=accept_stochastic, fresh: bool = False
                 ) -> tuple[float, float]:
        """(max abs difference from the target's window distribution over CONTEXTS, the largest
        P(bonus after full acceptance) among them)."""
        diffs, fulls = [], []
        for first in CONTEXTS:
            complete = self._completions(params, first)
            dist, full = window_distribution(self._rounds(method, params, first, fresh), accept, complete)
            diffs.append(float((dist - complete(())).abs().max()))
            fulls.append(full)
        return max(diffs), max(fulls)


@pytest.fixture(scope="module")
def exact(models):
    return ExactCheck(models)


# ---- the certification ----

@pytest.mark.parametrize("name", list(METHODS))
@pytest.mark.parametrize("params", PARAMS, ids=["T1", "T0.7-p0.9-k6"])
def test_round_is_exactly_lossless(exact, name, params):
    diff, full = exact(METHODS[name], params)
    print(f"{name} {params}: max abs diff {diff:.2e}, P(bonus after full acceptance) {full:.3f}")
    assert diff < PASS_DIFF
    if name != "plain":  # the window must contain the bonus after a fully accepted draft
        assert full > MIN_FULL


DRAFT_TEMPERATURES = [(1.3, SamplingParams(0.7)), (1.3, PARAMS[1]), (0.0, SamplingParams(0.7))]


@pytest.mark.parametrize("draft_temperature,params", DRAFT_TEMPERATURES, ids=["1.3-T0.7", "1.3-T0.7-p0.9-k6", "0-T0.7"])
def test_sps_draft_temperature_is_exactly_lossless(exact, draft_temperature, params):
    """Drafts sampled from, and q recorded at, a draft temperature (0: greedy drafts, the deterministic
    rule; with these models such a chain is rarely all accepted, so only losslessness is asserted)."""
    diff, full = exact({**METHODS["sps"], "draft_temperature": draft_temperature}, params)
    print(f"sps draft T {draft_temperature} {params}: max abs diff {diff:.2e}, P(full) {full:.2e}")
    assert diff < PASS_DIFF
    assert full > MIN_FULL or not draft_temperature


# ---- negative controls: the same exact check must reject broken rules ----

@dataclass
class BentCoins:
    """Draws whose coins are bent: accept(scale * numerator, 1 if q_is_one else denominator)."""

    inner: Draws
    scale: float = 1.0
    q_is_one: bool = False

    def accept(self, numerator: float, denominator: float = 1.0) -> bool:
        return self.inner.accept(self.scale * numerator, 1.0 if self.q_is_one else denominator)

    def categorical(self, probs: torch.Tensor) -> int:
        return self.inner.categorical(probs)


def _ratio_1_1(tree, p_target, draws):
    """Sampled drafts accepted with min(1, 1.1 p/q) (every coin of an SpS chain is such a test)."""
    return accept_stochastic(tree, p_target, BentCoins(draws, scale=1.1))


def _q_is_one(tree, p_target, draws):
    """q taken as 1 in the SpS acceptance ratio (the residual still norm(max(0, p - q)))."""
    return accept_stochastic(tree, p_target, BentCoins(draws, q_is_one=True))


def _parent_bonus(tree, p_target, draws):
    """The bonus after a fully accepted draft sampled from the leaf's parent's distribution."""
    bent = p_target.clone()
    for leaf in (i for i, kids in enumerate(tree.children) if i and not kids):
        bent[leaf] = p_target[int(tree.parents[leaf])]
    return accept_stochastic(tree, bent, draws)


def _always_accept(tree, p_target, draws):
    """Every first child accepted down to a leaf, the bonus from the leaf's distribution."""
    node, path = 0, []
    while tree.children[node]:
        node = tree.children[node][0]
        path.append(node)
    return path, draws.categorical(p_target[node])


def _sample_at_t1(self, logits):
    """SpS drafts sampled at temperature 1 while q is recorded at the target's settings."""
    token = self.draws.categorical(probabilities(logits, replace(self.params, temperature=1.0)))
    return token, probabilities(logits, self.params)


_ORIGINAL_ANCESTORS = DraftTree.ancestor_matrix


def _sibling_visible(tree):  # nodes also see every node of their own depth
    depth = tree.depths
    return _ORIGINAL_ANCESTORS(tree) | (depth[:, None] == depth[None, :])


ACCEPT_CONTROLS = {"ratio_1.1": _ratio_1_1, "q_is_one": _q_is_one, "parent_bonus": _parent_bonus,
                   "always_accept": _always_accept}
T1 = SamplingParams(1.0)
CONTROLS = [("ratio_1.1", "sps", T1), ("q_is_one", "sps", T1), ("always_accept", "sps", T1),
            ("always_accept", "eagle2", T1), ("sibling_visible_mask", "eagle", T1),
            ("sps_sampled_at_t1", "sps", SamplingParams(0.7))]
CONTROLS += [("parent_bonus", name, T1) for name in METHODS if name != "plain"]


@pytest.mark.parametrize("control,name,params", CONTROLS, ids=[f"{c}-{m}" for c, m, _ in CONTROLS])
def test_negative_control_is_rejected_exactly(exact, monkeypatch, control, name, params):
    if control == "sibling_visible_mask":
        monkeypatch.setattr(DraftTree, "ancestor_matrix", _sibling_visible)
    elif control == "sps_sampled_at_t1":
        monkeypatch.setattr(SpsDrafter, "_draft_token", _sample_at_t1)
    accept = ACCEPT_CONTROLS.get(control)
    diff, _ = exact(METHODS[name], params, accept or accept_stochastic, fresh=accept is None)
    print(f"control {control} on {name} {params}: max abs diff {diff:.2e}")
    assert diff > REJECT_DIFF
