"""DFlash (``eagle2.heads.dflash_head``, ``eagle2.drafters.dflash``, ``eagle2.training.objectives.dflash_head``): one
draft forward per round denoises the block; drafting reads exactly what training fits (the same outputs, slot for
slot, in the first round and after a commit, through the draft's KV cache); a block sees the context strictly before
its anchor and never another block; the format is z-lab's, round-trips and is loaded strictly; the loss trains every
slot, and the objective joins a joint run. Losslessness: ``tests/test_greedy.py`` (``SPEC_METHODS``, batch 1;
``test_batch.py``, batched: the same drafts as batch 1, T = 0 and T > 0), ``tests/test_certification_exact.py`` and
``tests/test_zoo.py`` (``FAMILY.fixture``)."""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch
from omegaconf import OmegaConf

from eagle2.bench.methods import build_drafter
from eagle2.core.sampling import SamplingParams
from eagle2.heads.dflash_head import FAMILY, DFlashHead, load_dflash_head, write_random
from eagle2.training.data import collate, split_shards, token_sequences
from eagle2.training.features import OnlineFeatures
from eagle2.training.objectives import objectives
from eagle2.training.objectives.dflash_head import block_forward, block_layout, dflash_loss
from eagle2.training.objectives.joint import JointHeads, head_taps, joint_loss, joint_members
from tests import one_forward
from tests.conftest import tiny_dflash_head
from tests.test_online_features import token_corpus  # noqa: F401  (the fixture)
from tests.test_training import head_cfg, tiny_target

METHOD = {"name": "dflash", "top_k": 2, "total_tokens": 6}


models = one_forward.models_fixture(lambda target: tiny_dflash_head(target, seed=1, block_size=5))


def test_one_draft_forward_per_round(models, monkeypatch):
    target, head = models
    drafter = one_forward.one_per_round(monkeypatch, head, target, METHOD, {"dflash_head": head})
    assert drafter.depth == 4  # a block of 5: 4 depths


@torch.no_grad()
def test_drafting_reads_what_training_fits(models):
    """The drafter's block distributions equal the training layout's at that anchor: after the prompt, and after a
    commit (the context then comes half from the draft's cache, half from the new features)."""
    target, head = models
    prompt, first, more = [3, 9, 4, 11, 2], 6, [8, 5]
    seq = prompt + [first] + more
    taps = one_forward.taps_of(target, head.feature_layers, seq)  # (len, k*H)
    drafter = build_drafter(OmegaConf.create(METHOD), target, SamplingParams(), None, dflash_head=head)
    drafter.start(prompt, first, taps[:len(prompt)])
    for anchor in (len(prompt), len(seq) - 1):
        if anchor > len(prompt):  # the root and the first new token were verified: their features come in
            drafter.observe(more, taps[len(prompt):anchor])
        drafted = drafter.parallel_log_probs()  # (K, V)
        out = block_forward(head, torch.tensor(seq[:anchor + 1]), taps[:anchor + 1], torch.tensor([anchor]))
        fitted = torch.log_softmax(head.logits(out[0, 1:]), -1)
        torch.testing.assert_close(drafted, fitted, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_a_block_sees_the_context_before_its_anchor_and_its_own_block(models):
    target, head = models
    positions, allowed = block_layout(6, torch.tensor([2, 4]), 3)
    assert positions.tolist() == [0, 1, 2, 3, 4, 5, 2, 3, 4, 4, 5, 6]
    assert allowed[:3, :6].sum(1).tolist() == [2, 2, 2] and allowed[3:, :6].sum(1).tolist() == [4, 4, 4]
    assert allowed[:3, 6:9].all() and not allowed[:3, 9:].any() and not allowed[3:, 6:9].any()
    tokens = torch.tensor([3, 9, 4, 11, 2, 6])
    taps = one_forward.taps_of(target, head.feature_layers, tokens.tolist())
    out = block_forward(head, tokens, taps, torch.tensor([4]))
    later = taps.clone()
    later[4:] += 1.0  # the anchor's own feature and after: unseen
    torch.testing.assert_close(block_forward(head, tokens, later, torch.tensor([4])), out)
    earlier = taps.clone()
    earlier[3] += 1.0  # the context's last feature: every slot reads it
    changed = (block_forward(head, tokens, earlier, torch.tensor([4])) - out).abs().amax(-1)
    assert (changed > 1e-4).all()


def test_format_is_z_labs_round_trips_and_loads_strictly(models, tmp_path):
    target, _ = models
    folder = write_random(tmp_path / "h", target.config)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["num_hidden_layers"] == 2
    head = FAMILY.load(folder, target)
    assert config["dflash_config"] == {"block_size": 8, "mask_token_id": 31,
                                       "target_layer_ids": [t - 1 for t in head.feature_layers]}
    assert isinstance(head, DFlashHead) and head.block_size == 8 and head.mask_token_id == 31
    again = load_dflash_head(FAMILY.save(head, tmp_path / "again"), target)
    torch.testing.assert_close(again.fc.weight, head.fc.weight)
    assert again.feature_layers == head.feature_layers
    one_forward.refused_without(folder, "layers.1.self_attn.k_norm.weight", load_dflash_head, target)


def test_loss_trains_every_slot(models):
    target, _ = models
    head = tiny_dflash_head(target, seed=2, block_size=4).float().train().requires_grad_(True)
    batch = one_forward.tapped_batch(target, head.feature_layers)
    first, stats = one_forward.train_steps(head, partial(dflash_loss, num_anchors=8), batch)
    assert {"top1", "top1_s2", "top1_s3"} <= set(stats) and stats["loss"] < first["loss"] - 0.1
    shared = {id(target.lm_head.weight), id(target.get_input_embeddings().weight)}
    assert not shared & {id(p) for p in head.parameters()}  # the target's embedding and LM head: read, never trained


def test_the_member_loss_is_its_solo_loss_in_a_joint_forward(token_corpus):  # noqa: F811
    """Beside an EAGLE-3 head (taps 2, 2, 1) a DFlash draft model tapping 1, 2, 3 reads its own layers of the one
    joint forward: its loss there is its own objective's on a batch featurized for it."""
    target = tiny_target(layers=4)
    common = dict(autocast="off", target_dtype="same", noise=0.0, epochs=1, seed=3)
    cfg = OmegaConf.create({"eagle3": head_cfg(**common, draft_vocab_size=40, unroll=1, step_decay=1.0),
                            "dflash_head": head_cfg(**common, layers=1, block_size=4, num_anchors=6,
                                                    loss_decay_gamma=4, taps=[1, 2, 3]),
                            "joint": head_cfg(**common, heads=["eagle3", "dflash_head"], primary="eagle3")})
    members = {o.stage: o.member for o in objectives().values() if o.member is not None}
    heads, losses = {}, {}
    for name, member in joint_members(cfg, members).items():
        heads[name], losses[name], _ = member.setup(target, token_corpus, cfg[name])
    module = JointHeads(heads, primary="eagle3")
    raw = collate(token_sequences(split_shards(token_corpus, 0.25, "tokens_*.npz")[0])[:4], "cpu")
    joint_batch = OnlineFeatures(target, module.tap_layers())(dict(raw))
    _, stats = joint_loss(module, joint_batch, losses=losses, train=False)
    solo, _ = losses["dflash_head"](heads["dflash_head"], OnlineFeatures(target, head_taps(heads["dflash_head"]))(
        dict(raw)), train=False)
    assert stats["dflash_head/loss"] == pytest.approx(float(solo.detach()), rel=1e-6, abs=1e-7)
