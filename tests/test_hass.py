"""HASS (``train_head.py stage=hass``): the top-k distillation loss's value and gradient, the detached unroll,
both phases training and exporting an EAGLE head that ``method=hass`` decodes losslessly; tiny models on CPU."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from eagle2.bench.methods import build_drafter
from eagle2.core.engine import generate
from eagle2.heads.eagle_head import load_head
from eagle2.training.objectives.hass import train_hass
from eagle2.training.support.losses import LossProjection, soft_cross_entropy, unrolled_predictions
from tests.conftest import tiny_head, tiny_llama
from tests.test_eagle3 import GREEDY
from tests.test_training import corpus, head_cfg, target, train_losses  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("synthetic_cost_profile")


def test_top_k_loss_value_and_gradient_by_hand():
    torch.manual_seed(0)
    lm_head = torch.nn.Linear(8, 20, bias=False)
    proj = LossProjection(lm_head)
    x, y = torch.randn(5, 8, requires_grad=True), torch.randn(5, 8)
    loss, _ = soft_cross_entropy(x, y, proj, topk=0, top_k=3, top_k_weight=2.0)
    loss.backward()
    x2 = x.detach().clone().requires_grad_(True)
    logp, q = torch.log_softmax(lm_head(x2), -1), torch.softmax(lm_head(y), -1).detach()
    top = q.topk(3, -1).indices
    by_hand = -(q * logp).sum(-1).mean() - 2.0 * (q.gather(-1, top) * logp.gather(-1, top)).sum(-1).mean()
    by_hand.backward()
    torch.testing.assert_close(loss, by_hand)
    torch.testing.assert_close(x.grad, x2.grad)


def test_detached_unroll_cuts_the_gradient_through_earlier_steps():
    model = tiny_llama(vocab=32, layers=2, seed=0)
    head = tiny_head(model, seed=1).float().train()
    tokens = torch.randint(0, 32, (1, 9), generator=torch.Generator().manual_seed(0))
    feats = torch.randn(1, 8, 32, requires_grad=True)
    answer = torch.ones(1, 8, dtype=torch.bool)
    grads = {}
    for detach in (False, True):
        feats.grad = None
        last = list(unrolled_predictions(head, tokens, feats, answer, 2, detach))[-1][1]
        last[0, -1].sum().backward()  # step 2 at the last position: reads step 1's prediction at index 6
        grads[detach] = feats.grad.clone()
    # both reach the features through the step-1 keys; only the undetached one through step 1's prediction too
    assert not torch.allclose(grads[False], grads[True])
    torch.testing.assert_close(grads[False][0, 7], grads[True][0, 7])  # (position 7 feeds neither)


def test_hass_trains_both_phases_and_exports_an_eagle_head(target, corpus, tmp_path):  # noqa: F811
    cfg = head_cfg(epochs=6, unroll=3, detach_unroll=True, top_k=4, w_topk=0.0,
                   topk_phase={"w_topk": 1.0, "lr": 1e-3, "max_steps": 6})
    head, summary = train_hass(target, corpus, cfg, tmp_path / "run")
    assert "phase1" in summary and summary["step"] == 6
    assert (tmp_path / "run" / "phase1_head").is_dir() and (tmp_path / "run" / "topk" / "metrics.jsonl").exists()
    phase1 = train_losses(tmp_path / "run")
    steps = sorted(phase1)
    assert sum(phase1[s] for s in steps[-3:]) < 0.8 * sum(phase1[s] for s in steps[:3])
    load_head(tmp_path / "run" / "phase1_head", target)  # the published format


def test_method_hass_decodes_as_plain():
    model = tiny_llama(vocab=64, layers=2, seed=3, scale=4.0)
    head = tiny_head(model, seed=2)
    plain = build_drafter(OmegaConf.create({"name": "plain"}), model, GREEDY, None)
    hass = OmegaConf.create({"name": "hass", "total_tokens": 6, "depth": 3, "top_k": 3})
    for prompt in ([2, 5, 3], [7, 7, 3, 9, 4, 11]):
        want = generate(model, plain, prompt, GREEDY, 24, set()).output_ids
        drafter = build_drafter(hass, model, GREEDY, None, weights={"hass_head": head})
        assert generate(model, drafter, prompt, GREEDY, 24, set()).output_ids == want
