"""PARD (``eagle2.heads.pard_draft``, ``eagle2.drafters.pard``, ``eagle2.training.objectives.pard_draft``): one draft
forward per round drafts every depth, the draft's cache holding only the committed tokens between rounds; drafting
reads exactly what training's layout fits (the same outputs, slot for slot, after rounds that rolled the cache back);
the format round-trips and loads strictly (the authors' ``pard_token`` too); the objective starts from the SpS draft
and trains every depth. Losslessness: ``tests/test_greedy.py`` (``SPEC_METHODS``, batch 1; ``test_batch.py``,
batched: the same drafts as batch 1, T = 0 and T > 0), ``tests/test_certification_exact.py`` and
``tests/test_zoo.py`` (``FAMILY.fixture``)."""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch
from omegaconf import OmegaConf

from eagle2.bench.methods import build_drafter
from eagle2.core.sampling import SamplingParams
from eagle2.heads.draft_model import build_draft_model, save_draft_model
from eagle2.heads.pard_draft import FAMILY, MASK_FILE, load_pard_draft, write_random
from eagle2.training.objectives.pard_draft import new_pard_draft, parallel_forward, pard_loss
from eagle2.training.support.losses import LossProjection
from tests import one_forward
from tests.conftest import tiny_pard_draft

METHOD = {"name": "pard", "depth": 4, "top_k": 2, "total_tokens": 6}


models = one_forward.models_fixture(lambda target: tiny_pard_draft(target, seed=1))


def test_one_draft_forward_per_round(models, monkeypatch):
    target, draft = models
    drafter = one_forward.one_per_round(monkeypatch, draft.lm.base_model, target, METHOD, {"pard_draft": draft})
    assert drafter.depth == 4 and drafter.cache.get_seq_length() == drafter.committed  # no mask slot left in the cache


@torch.no_grad()
def fitted(draft, context: list[int], depth: int) -> torch.Tensor:
    """(depth, V) log-probabilities the training layout gives from the last token of ``context``."""
    anchor = torch.tensor([len(context) - 1])
    out, _, slot_depth = parallel_forward(draft, torch.tensor(context + [0]), [anchor] * (depth - 1))
    rows = torch.cat([anchor, (slot_depth > 1).nonzero()[:, 0]])
    return torch.log_softmax(draft.drafting_lm_head()(out[rows]).float(), -1)


@torch.no_grad()
def test_drafting_reads_what_training_fits(models):
    """The drafter's K distributions equal the training layout's at that anchor, at the first round and after
    rounds whose drafts were partly accepted (the cache rolled back, the slots dropped)."""
    target, draft = models
    drafter = build_drafter(OmegaConf.create(METHOD), target, SamplingParams(), None, pard_draft=draft)
    context = [3, 9, 4, 11, 2, 6]
    drafter.start(context[:-1], context[-1], None)
    for accepted in ([5, 8], [1], [30, 4, 4, 7]):
        torch.testing.assert_close(drafter.parallel_log_probs(), fitted(draft, context, 4), atol=1e-5, rtol=1e-5)
        drafter.observe(accepted, None)
        context += accepted


def test_format_round_trips_and_loads_strictly(models, tmp_path):
    target, draft = models
    again = load_pard_draft(FAMILY.save(draft, tmp_path / "d"), target)
    assert again.para_depths == 4 and again.lm.get_input_embeddings() is target.get_input_embeddings()
    torch.testing.assert_close(again.mask_embedding, draft.mask_embedding)
    torch.testing.assert_close(fitted(again, [3, 9, 4], 4), fitted(draft, [3, 9, 4], 4))
    from safetensors.torch import save_file

    save_file({"mask_embedding": torch.zeros(3)}, str(tmp_path / "d" / MASK_FILE))  # a wrong shape
    with pytest.raises(KeyError, match="mask_embedding"):
        load_pard_draft(tmp_path / "d", target)
    published = write_random(tmp_path / "r", target.config)  # a full checkpoint with its own embedding
    assert FAMILY.load(published, target).mask_embedding.abs().sum() > 0
    (published / MASK_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="pard_token"):
        load_pard_draft(published, target)
    config = json.loads((published / "config.json").read_text())
    (published / "config.json").write_text(json.dumps({**config, "pard_token": 5}))  # the authors' format
    own = load_pard_draft(published, target)
    torch.testing.assert_close(own.mask_embedding, own.lm.get_input_embeddings().weight[5])


def test_adapts_the_sps_draft(models, tmp_path):
    """Started from an SpS draft folder: its weights, depth 1 its next-token distribution, the target's embedding and
    LM head shared and frozen, the mask the mean embedding row; only the draft's own weights train."""
    target, _ = models
    sps = build_draft_model(target, 1)
    torch.nn.init.normal_(sps.model.layers[0].mlp.up_proj.weight, std=0.1)
    cfg = OmegaConf.create({"init_from": str(save_draft_model(sps, tmp_path / "sps")), "para_depths": 3})
    draft = new_pard_draft(target, cfg)
    with torch.no_grad():
        ids = torch.tensor([[3, 9, 4, 11]])
        torch.testing.assert_close(fitted(draft, ids[0].tolist(), 1)[0],
                                   torch.log_softmax(sps(ids).logits[0, -1].float(), -1), atol=1e-5, rtol=1e-5)
    embed = target.get_input_embeddings().weight
    assert draft.lm.get_input_embeddings().weight is embed and not embed.requires_grad
    torch.testing.assert_close(draft.mask_embedding.detach(), embed.mean(0))
    trained = {n for n, p in draft.named_parameters() if p.requires_grad}
    assert "mask_embedding" in trained and not any("embed_tokens" in n or "lm_head" in n for n in trained)


@pytest.mark.parametrize("distill", [True, False])
def test_loss_trains_every_depth(models, distill):
    target, _ = models
    draft = tiny_pard_draft(target, seed=2)
    for name, param in draft.named_parameters():
        param.requires_grad_(name not in draft.shared_keys)
    tokens = torch.randint(32, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        hidden = target.model(tokens).last_hidden_state
    valid = torch.ones_like(tokens).bool()
    valid[1, 12:] = False  # a right-padded row
    batch = {"tokens": tokens, "features": hidden, "valid": valid, "start": torch.tensor([4, 6])}
    proj = LossProjection(target.get_output_embeddings())
    first, stats = one_forward.train_steps(draft.train(), partial(pard_loss, proj=proj, distill=distill), batch)
    assert {"top1", "top1_s2", "top1_s3", "top1_s4"} <= set(stats)
    assert stats["loss"] < first["loss"] - 0.1 and draft.mask_embedding.grad.abs().sum() > 0


@pytest.mark.parametrize("distill", [True, False])
def test_loss_is_the_mean_over_elements_of_each_slots_next_token_loss(models, distill):
    """By hand, every anchor kept (shares 1): element (anchor a, depth d) stands at position p = a + d - 1, counted
    when p counts, fitted to the target's next-token distribution softmax(lm_head(f[p])) (``distill``) or to the
    token t[p + 1]; the loss is the mean over all elements (each depth weighted by its count)."""
    from eagle2.training.objectives.peagle_head import cod_anchors

    target, _ = models
    draft = tiny_pard_draft(target, seed=2)
    tokens = torch.randint(32, (1, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        hidden = target.model(tokens).last_hidden_state
    batch = {"tokens": tokens, "features": hidden, "valid": torch.ones_like(tokens).bool(), "start": torch.tensor([5])}
    loss, _ = pard_loss(draft, batch, proj=LossProjection(target.get_output_embeddings()), ratio=1.0, floor=1.0,
                        distill=distill, with_stats=False)
    answer = torch.arange(11) >= 4  # position p counts when token p + 1 is an answer token (start 5)
    out, anchor, depth = parallel_forward(draft, tokens[0], cod_anchors(answer, draft.para_depths, 1.0, 1.0, None))
    terms = []
    for row, p in enumerate((anchor + depth - 1).tolist()):
        if answer[p]:
            logp = torch.log_softmax(target.lm_head(out[row]).float(), -1)
            want = torch.softmax(target.lm_head(hidden[0, p]).float(), -1) if distill else \
                torch.nn.functional.one_hot(tokens[0, p + 1], 32).float()
            terms.append(-(want * logp).sum())
    torch.testing.assert_close(loss, torch.stack(terms).mean(), atol=1e-5, rtol=1e-5)
