"""P-EAGLE (``eagle2.heads.peagle_head``, ``eagle2.drafters.peagle``, ``eagle2.training.objectives.peagle_head``): one
head forward per round drafts every depth; drafting reads exactly what training's layout fits (the same outputs, slot
for slot); COD keeps the shares it says; the format round-trips and is loaded strictly; the loss trains.
Losslessness: ``tests/test_greedy.py`` (``SPEC_METHODS``, batch 1; ``test_batch.py``, batched: the same drafts as
batch 1, T = 0 and T > 0), ``tests/test_certification_exact.py`` and ``tests/test_zoo.py`` (``FAMILY.fixture``)."""

from __future__ import annotations

from functools import partial

import torch
from omegaconf import OmegaConf

from eagle2.bench.methods import build_drafter
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
