"""The acceptance rule's branch for sampled siblings, certified exactly: no shipped drafter samples a tree (SpS
samples a chain, the tree drafters choose their siblings), so ``test_certification_exact`` never tries a second
sampled sibling after a rejected first one. Here a test drafter draws every child i.i.d. from its own q (the
draft model's distribution at the node: siblings may repeat) and one real engine round is enumerated exactly, as
there, against the target's joint distribution over the window (SpecInfer's multi-round rule: after a rejected
sibling the residual is norm(max(0, r - q)), r the residual so far).

Negative controls: the residual restarting from p after each rejected sibling (norm(max(0, p - q)), the bug the
enumeration over chains cannot see) and accepting the second sibling against p instead of the residual are
rejected by the same check (``test_a_broken_sibling_residual_is_rejected``).
"""

from __future__ import annotations

import pytest
import torch

import eagle2.core.accept as accept_module
import eagle2.core.engine as engine
import tests.test_certification_exact as exact
from eagle2.core.accept import accept_stochastic
from eagle2.core.sampling import SamplingParams, as_draws, probabilities
from eagle2.core.tree import DraftTree
from tests.test_certification_exact import models as models  # noqa: F401  (the module-scoped fixture)


class SampledTree:
    """``width`` children of the root, each drawn from q (the draft model's distribution at the context, cut to its
    three most likely tokens: a q of small support keeps the enumeration short, and any q is lossless), every
    sibling sampled, repeats allowed."""

    needs_hidden, forward_time = False, 0.0

    def __init__(self, draft_model, params: SamplingParams, draws, width: int = 3):
        self.model, self.draws, self.width = draft_model, as_draws(draws), width
        self.params = SamplingParams(params.temperature, 1.0, 3)

    def start(self, prompt_ids, first_token, prompt_hidden) -> None:
        self.sequence = list(prompt_ids) + [first_token]

    def observe(self, new_tokens, hidden) -> None:
        self.sequence.extend(new_tokens)

    def propose(self, root: int, room: int) -> DraftTree:
        with torch.no_grad():
            q = probabilities(self.model(torch.tensor([self.sequence])).logits[0, -1], self.params)
        drafted = [self.draws.categorical(q) for _ in range(self.width)]
        q_draft = torch.stack([torch.zeros_like(q)] + [q] * self.width)  # row 0: the root
        return DraftTree(torch.tensor([root, *drafted]), torch.tensor([-1] + [0] * self.width), q_draft=q_draft)


ROUNDS: dict = {}  # (params, first) -> the enumerated rounds: the controls reuse them


def sampled_rounds(models, params: SamplingParams, first: int):
    """Every ((tree, p_target), probability) of one engine round with the sampled-tree drafter after PROMPT +
    [first]."""
    target, draft, _ = models
    captured = []

    def capture(tree, p_target, generator):
        captured.append((tree, p_target))
        return [], 0

    def run(draws):
        engine.generate(target, SampledTree(draft, params, draws), exact.PROMPT, params, 2, set(), None)
        return captured.pop()

    if (params, first) not in ROUNDS:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(engine, "next_token", lambda *args: first)
            mp.setattr(engine, "accept_stochastic", capture)
            ROUNDS[params, first] = exact.enumerate_outcomes(run)
    return ROUNDS[params, first]


def max_difference(models, params: SamplingParams, accept=accept_stochastic) -> float:
    """The largest difference from the target's window distribution over CONTEXTS."""
    worst = 0.0
    for first in exact.CONTEXTS:
        complete = exact.Completions(models[0], params, exact.PROMPT + [first])
        dist, _ = exact.window_distribution(sampled_rounds(models, params, first), accept, complete)
        worst = max(worst, float((dist - complete(())).abs().max()))
    return worst


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, 0.9, 6)], ids=["T1", "T0.7-p0.9-k6"])
def test_sampled_siblings_are_exactly_lossless(models, params):  # noqa: F811
    diff = max_difference(models, params)
    print(f"sampled siblings {params}: max abs diff {diff:.2e}")
    assert diff < exact.PASS_DIFF


def _restart_from_p(residual, x, q, p_node, draws):
    """BROKEN: after a rejected sampled sibling the residual restarts from p (norm(max(0, p - q)))."""
    if q is None or draws.accept(float(residual[x]), float(q[x])):
        return ORIGINAL_TRY(residual, x, q, p_node, draws)
    return False, accept_module._normalise((p_node - q).clamp_min(0.0), p_node)


def _ratio_against_p(residual, x, q, p_node, draws):
    """BROKEN: every sampled sibling tested with min(1, p(x) / q(x)) instead of the residual's r(x)."""
    if q is None:
        return ORIGINAL_TRY(residual, x, q, p_node, draws)
    if draws.accept(float(p_node[x]), float(q[x])):
        return True, residual
    return False, accept_module._normalise((residual - q).clamp_min(0.0), p_node)


ORIGINAL_TRY = accept_module._try_child


@pytest.mark.parametrize("broken", [_restart_from_p, _ratio_against_p], ids=["restart_from_p", "ratio_against_p"])
def test_a_broken_sibling_residual_is_rejected(models, monkeypatch, broken):  # noqa: F811
    monkeypatch.setattr(accept_module, "_try_child", broken)
    diff = max_difference(models, SamplingParams(1.0))
    print(f"control {broken.__name__}: max abs diff {diff:.2e}")
    assert diff > exact.REJECT_DIFF

