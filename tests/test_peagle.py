"""P-EAGLE (``eagle2.heads.peagle_head``, ``eagle2.drafters.peagle``, ``eagle2.training.objectives.peagle_head``): one
head forward per round drafts every depth; drafting reads exactly what training's layout fits (the same outputs, slot
for slot); COD keeps the shares it says; the format round-trips and is loaded strictly; the loss trains.
Losslessness: ``tests/test_greedy.py`` (``SPEC_METHODS``, batch 1; ``test_batch.py``, batched: the same drafts as
batch 1, T = 0 and T > 0), ``tests/test_certification_exact.py`` and ``tests/test_zoo.py`` (``FAMILY.fixture``)."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from omegaconf import OmegaConf

from eagle2.bench.methods import build_drafter
from eagle2.core.features import LayerTap
from eagle2.core.sampling import SamplingParams
from eagle2.heads.peagle_head import FAMILY, PEagleHead, load_peagle_head, write_random
from eagle2.training.objectives.peagle_head import cod_anchors, parallel_forward, peagle_loss
from eagle2.training.support.losses import LossProjection
from tests import one_forward
from tests.conftest import tiny_peagle_head

METHOD = {"name": "peagle", "depth": 4, "top_k": 2, "total_tokens": 6}


models = one_forward.models_fixture(lambda target: tiny_peagle_head(target, seed=1, para_depths=4))


def test_one_head_forward_per_round(models, monkeypatch):
    target, head = models
    assert one_forward.one_per_round(monkeypatch, head, target, METHOD, {"peagle_head": head}).depth == 4


@torch.no_grad()
def test_drafting_reads_what_training_fits(models):
    """The drafter's K distributions after a prompt equal the training layout's outputs at that anchor."""
    target, head = models
    prompt, first = [3, 9, 4, 11, 2], 6
    taps = one_forward.taps_of(target, head.feature_layers, prompt + [first])  # (P + 1, k*H): the last unread
    drafter = build_drafter(OmegaConf.create(METHOD), target, SamplingParams(), None, peagle_head=head)
    drafter.start(prompt, first, taps[:-1])
    drafted = drafter.parallel_log_probs()  # (K, V)
    anchor = torch.tensor([len(prompt) - 1])
    out, anchors, depth = parallel_forward(head, torch.tensor(prompt + [first]), taps, [anchor] * 3)
    rows = torch.cat([anchor, (depth > 1).nonzero()[:, 0]])
    fitted = torch.log_softmax(head.drafting_lm_head()(out[rows]).float(), -1)
    torch.testing.assert_close(drafted, fitted, atol=1e-5, rtol=1e-5)


def test_cod_keeps_its_shares():
    answer = torch.ones(200, dtype=torch.bool)
    answer[:20] = False  # the prompt
    kept = cod_anchors(answer, 6, 0.7, 0.2, torch.Generator().manual_seed(0))
    assert [len(k) for k in kept] == [round(180 * max(0.7 ** d, 0.2)) for d in range(1, 6)]
    for d, (outer, inner) in enumerate(zip(kept, kept[1:]), start=2):  # nested: a slot has its predecessors
        assert set(inner.tolist()) <= set(outer.tolist()) and int(inner.max()) + d < 200
    every = cod_anchors(answer, 3, 1.0, 1.0, None)
    assert [len(k) for k in every] == [179, 178]  # all anchors whose target is in the row


def test_format_round_trips_and_loads_strictly(models, tmp_path):
    target, _ = models
    folder = write_random(tmp_path / "h", target.config)
    head = FAMILY.load(folder, target)
    assert isinstance(head, PEagleHead) and head.para_depths == 4 and head.mask_hidden.abs().sum() > 0
    again = load_peagle_head(FAMILY.save(head, tmp_path / "again"), target)
    torch.testing.assert_close(again.mask_hidden, head.mask_hidden)
    one_forward.refused_without(folder, "mask_hidden", load_peagle_head, target)


def test_loss_trains_every_depth(models):
    target, _ = models
    head = tiny_peagle_head(target, seed=2).float().train().requires_grad_(True)
    batch = one_forward.tapped_batch(target, head.feature_layers)
    proj = LossProjection(target.get_output_embeddings())
    first, stats = one_forward.train_steps(head, partial(peagle_loss, proj=proj), batch)  # soft CE: floor > 0
    assert {"top1", "top1_s2", "top1_s3", "top1_s4"} <= set(stats)
    assert stats["loss"] < first["loss"] - 0.1 and head.mask_hidden.grad.abs().sum() > 0


# ---- properties the mutation audit (experiments/audit/mutations_new_drafters.py) found unguarded ----

@torch.no_grad()
def test_slots_read_the_mask_token_and_mask_hidden(models):
    """Built by hand: the drafting forward is the context's pairs then K - 1 slots, each the embedding of
    ``ptd_token_id`` with ``mask_hidden`` for features, at the next positions, causal."""
    from eagle2.heads.eagle_head import causal_mask

    target, head = models
    prompt, first = [3, 9, 4, 11, 2], 6
    taps = one_forward.taps_of(target, head.feature_layers, prompt + [first])
    drafter = build_drafter(OmegaConf.create(METHOD), target, SamplingParams(), None, peagle_head=head)
    drafter.start(prompt, first, taps[:-1])
    ids = torch.tensor(prompt[1:] + [first] + [head.config.ptd_token_id] * 3)
    feats = torch.cat([taps[:-1], head.mask_hidden[0, 0].expand(3, -1)])
    out = head(ids[None], feats[None], position_ids=torch.arange(len(ids))[None],
               attention_mask=causal_mask(len(ids), 0, feats.dtype, "cpu"), cache=None)[0]
    by_hand = torch.log_softmax(head.drafting_lm_head()(out[len(prompt) - 1:]).float(), -1)
    torch.testing.assert_close(drafter.parallel_log_probs(), by_hand, atol=1e-5, rtol=1e-5)


def test_a_mask_token_outside_the_vocabulary_is_refused(models, tmp_path):
    import json

    target, _ = models
    folder = write_random(tmp_path / "h", target.config)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "ptd_token_id": target.config.vocab_size}))
    with pytest.raises(ValueError, match="ptd_token_id 32 is outside"):
        load_peagle_head(folder, target)


def test_cod_keeps_only_anchors_whose_every_depth_counts():
    """With every share 1, depth d keeps exactly the anchors a whose targets at depths 1..d all count
    (``answer[a .. a + d - 1]``), on a row with gaps."""
    answer = torch.rand(60, generator=torch.Generator().manual_seed(4)) < 0.7
    kept = cod_anchors(answer, 5, 1.0, 1.0, None)
    for d, anchors in enumerate(kept, start=2):
        want = [a for a in range(60 - d + 1) if bool(answer[a:a + d].all())]
        assert anchors.tolist() == want, d


def test_loss_is_the_soft_cross_entropy_of_each_slot_against_its_targets_next_token(models):
    """By hand, every anchor kept (shares 1): element (anchor a, depth d), counted when position a + d - 1 counts,
    is fitted to softmax(lm_head(f[a + d])) over the draft vocabulary, the mean over elements."""
    target, _ = models
    head = tiny_peagle_head(target, seed=2, para_depths=3).float()
    tokens = torch.randint(32, (1, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad(), LayerTap(target, head.feature_layers) as tap:
        hidden = target(tokens, output_hidden_states=True).hidden_states[-1]
        taps = tap.read()
    batch = {"tokens": tokens, "layer_features": taps, "features": hidden, "valid": torch.ones_like(tokens).bool(),
             "start": torch.tensor([5])}
    proj = LossProjection(target.get_output_embeddings())
    loss, _ = peagle_loss(head, batch, proj=proj, ratio=1.0, floor=1.0, with_stats=False)
    answer = torch.arange(11) >= 4  # head position j counts when token j + 1 is an answer token (start 5)
    out, anchor, depth = parallel_forward(head, tokens[0], taps[0], cod_anchors(answer, 3, 1.0, 1.0, None))
    ids, terms = head.draft_token_ids(), []  # the draft vocabulary's token ids (here: all of them)
    for row, (a, d) in enumerate(zip(anchor.tolist(), depth.tolist())):
        if answer[a + d - 1]:
            q = torch.softmax(target.lm_head(hidden[0, a + d]).float()[ids], -1)
            terms.append(-(q * torch.log_softmax(head.drafting_lm_head()(out[row]).float(), -1)).sum())
    torch.testing.assert_close(loss, torch.stack(terms).mean(), atol=1e-5, rtol=1e-5)
