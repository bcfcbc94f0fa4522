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


# ---- properties the mutation audit (experiments/audit/mutations_new_drafters.py) found unguarded ----

def test_phase_one_has_no_top_k_loss_and_phase_two_starts_from_it(tmp_path, monkeypatch):
    """Phase 1 trains without the top-k loss whatever ``w_topk`` says; phase 2 takes ``topk_phase``'s settings and
    continues phase 1's head (``init_from``: the phase-1 export)."""
    import eagle2.training.objectives.hass as hass

    model = tiny_llama(vocab=32, layers=2, seed=0)
    cfg = head_cfg(w_topk=0.5, top_k=4, topk_phase={"w_topk": 1.0, "lr": 1e-3, "max_steps": 2})
    assert hass.phase_settings(cfg, 1).w_topk == 0.0 and hass.phase_settings(cfg, 2).w_topk == 1.0
    seen = []
    monkeypatch.setattr(hass, "train_head", lambda _target, _corpus, c, _out, **kw: seen.append(c) or (
        tiny_head(model, seed=1), {"partial": False, "step": 2}))
    hass.train_hass(model, tmp_path, cfg, tmp_path / "run")
    assert [c.w_topk for c in seen] == [0.0, 1.0] and seen[1].init_from == str(tmp_path / "run" / "phase1_head")


def test_the_top_k_loss_weight_is_its_own_not_scaled_by_w_cls():
    """The loss is w_cls * CE + w_topk * top-k loss: the top-k term's share does not move with w_cls."""
    from eagle2.training.objectives.eagle import head_loss

    model = tiny_llama(vocab=32, layers=2, seed=0)
    head = tiny_head(model, seed=1).float()
    tokens = torch.randint(32, (1, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        feats = model.model(tokens).last_hidden_state
    batch = {"tokens": tokens, "features": feats, "valid": torch.ones_like(tokens).bool(), "start": torch.tensor([3])}
    proj = LossProjection(model.get_output_embeddings())

    def loss(w_cls, w_topk):
        with torch.no_grad():
            return float(head_loss(head, batch, proj=proj, noise=0.0, w_reg=0.0, w_cls=w_cls, top_k=3, w_topk=w_topk,
                                   with_stats=False)[0])

    assert loss(0.5, 1.0) - loss(0.5, 0.0) == pytest.approx(loss(1.0, 1.0) - loss(1.0, 0.0), rel=1e-4)


def test_the_hass_settings_reach_the_loss(target):  # noqa: F811
    from eagle2.training.objectives.eagle import head_setup

    _, loss_fn, extra = head_setup(target, head_cfg(unroll=3, detach_unroll=True, top_k=4, w_topk=1.0))
    assert loss_fn.keywords["detach_unroll"] and loss_fn.keywords["top_k"] == 4 and extra["detach_unroll"]


def test_detach_unroll_cuts_exactly_the_read_of_the_previous_prediction():
    """With ``detach`` step 2 reaches step 1's prediction through no path (its keys come from the inputs, not the
    outputs); without it, step 2 reads it."""
    model = tiny_llama(vocab=32, layers=2, seed=0)
    head = tiny_head(model, seed=1).float().train()
    tokens = torch.randint(0, 32, (1, 9), generator=torch.Generator().manual_seed(0))
    feats, answer = torch.randn(1, 8, 32), torch.ones(1, 8, dtype=torch.bool)
    for detach in (False, True):
        steps = {step: pred for step, pred, _ in unrolled_predictions(head, tokens, feats, answer, 2, detach)}
        reach = torch.autograd.grad(steps[2].sum(), steps[1], allow_unused=True)[0]
        assert (reach is None) == detach
