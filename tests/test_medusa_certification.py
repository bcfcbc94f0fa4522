"""Medusa is lossless at temperature > 0, certified by the machinery of ``test_certification_exact.py``
(one real round, every random outcome enumerated) and ``test_certification.py`` (chi-square over
2,500 samples through the engine), on their 8-token target with random Medusa heads (the chi-square tests are
marked slow).

Medusa's drafts are deterministic top-k choices, so they go through the rule for deterministically
chosen children. Negative controls run through the same checks and must be rejected: the authors'
typical acceptance (accept a candidate when p(x) > min(eps, alpha exp(-H(p))); lossy by design),
always accepting, the bonus after a full path drawn from the parent's distribution, and a mask that
lets a node see its whole depth.
"""

from __future__ import annotations

import pytest
import torch

import tests.test_certification as cert
import tests.test_certification_exact as exact_cert
from eagle2.bench.methods import build_drafter
from eagle2.core.accept import accept_stochastic
from eagle2.core.sampling import SamplingParams, as_draws
from eagle2.core.tree import DraftTree
from tests.test_medusa import tiny_medusa

MEDUSA = {"name": "medusa", "choices": [[0], [1], [2], [3], [0, 0], [1, 0], [2, 0], [3, 0]]}
PARAMS = exact_cert.PARAMS
T1 = SamplingParams(1.0)
models = cert.models  # the module-scoped tiny target, SpS draft and EAGLE head


@pytest.fixture(scope="module")
def medusa_heads(models):
    return tiny_medusa(models[0], num_heads=2, own_lm_head=True, seed=4, std=0.5)


@pytest.fixture
def with_medusa(monkeypatch, medusa_heads):
    """Both certification modules build drafters with the Medusa heads among the weights."""
    def build(*args, weights=None, **kwargs):
        return build_drafter(*args, weights={**(weights or {}), "medusa_head": medusa_heads}, **kwargs)

    monkeypatch.setattr(exact_cert, "build_drafter", build)
    monkeypatch.setattr(cert, "build_drafter", build)


@pytest.fixture(scope="module")
def exact(models):
    return exact_cert.ExactCheck(models)


# ---- exact: one round enumerated ----

@pytest.mark.parametrize("params", PARAMS, ids=["T1", "T0.7-p0.9-k6"])
def test_medusa_round_is_exactly_lossless(exact, with_medusa, params):
    diff, full = exact(MEDUSA, params)
    print(f"medusa {params}: max abs diff {diff:.2e}, P(bonus after full acceptance) {full:.3f}")
    assert diff < exact_cert.PASS_DIFF
    assert full > exact_cert.MIN_FULL  # the bonus after a fully accepted path is inside the window


def typical_acceptance(tree: DraftTree, p_target: torch.Tensor, draws, eps: float = 0.09, alpha: float = 0.3):
    """Medusa's typical acceptance (its ``evaluate_posterior`` at T > 0, applied per child in sibling
    order): a candidate x is accepted when p(x) > min(eps, alpha * exp(-entropy(p))); the next token
    is then sampled from the target's distribution at the last accepted node."""
    tokens, node, path = tree.tokens.tolist(), 0, []
    while True:
        p = p_target[node]
        threshold = min(eps, alpha * float(torch.exp((p * torch.log(p.clamp_min(1e-30))).sum())))
        nxt = next((c for c in tree.children[node] if float(p[tokens[c]]) > threshold), None)
        if nxt is None:
            return path, draws.categorical(p)
        path.append(nxt)
        node = nxt


def _sibling_visible(tree):
    depth = tree.depths
    return exact_cert._ORIGINAL_ANCESTORS(tree) | (depth[:, None] == depth[None, :])


CONTROLS = {"typical_acceptance": typical_acceptance, "always_accept": exact_cert._always_accept,
            "parent_bonus": exact_cert._parent_bonus, "sibling_visible_mask": None}


@pytest.mark.parametrize("control", list(CONTROLS))
def test_medusa_negative_control_is_rejected_exactly(exact, with_medusa, monkeypatch, control):
    if control == "sibling_visible_mask":
        monkeypatch.setattr(DraftTree, "ancestor_matrix", _sibling_visible)
    accept = CONTROLS[control]
    diff, _ = exact(MEDUSA, T1, accept or accept_stochastic, fresh=accept is None)
    print(f"control {control} on medusa: max abs diff {diff:.2e}")
    assert diff > exact_cert.REJECT_DIFF


# ---- end to end: chi-square over samples through the engine ----

@pytest.mark.slow  # ~30-50 s each at 1 thread; the exact round check above is the default certification
@pytest.mark.parametrize("params", cert.PARAMS, ids=["T1", "T0.7-p0.9-k6"])
def test_medusa_matches_target_distribution(models, with_medusa, params):
    target = models[0]
    counts = cert.sample_counts(target, MEDUSA, params, 2500, seed=11)
    assert cert.chi_square_p(counts, cert.exact_distribution(target, params)) > cert.PASS_P


@pytest.mark.slow
def test_medusa_typical_acceptance_fails_chi_square(models, with_medusa, monkeypatch):
    """Negative control end to end: Medusa's typical acceptance is rejected by the same test."""
    import eagle2.core.engine as engine

    monkeypatch.setattr(engine, "accept_stochastic",
                        lambda tree, p, gen: typical_acceptance(tree, p, as_draws(gen)))
    target = models[0]
    counts = cert.sample_counts(target, MEDUSA, T1, 2500, seed=13)
    assert cert.chi_square_p(counts, cert.exact_distribution(target, T1)) < cert.REJECT_P

