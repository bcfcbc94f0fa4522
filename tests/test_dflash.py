"""DFlash (``eagle2.heads.dflash_head``, ``eagle2.drafters.dflash``, ``eagle2.training.objectives.dflash_head``): one
draft forward per round denoises the block; drafting reads exactly what training fits (the same outputs, slot for
slot, in the first round and after a commit, through the draft's KV cache); a block sees the context strictly before
its anchor and never another block; the format is z-lab's, round-trips and is loaded strictly; the loss trains every
slot, and the objective joins a joint run. Losslessness: ``tests/test_greedy.py`` (``SPEC_METHODS``, batch 1;
``test_batch.py``, batched: the same drafts as batch 1, T = 0 and T > 0), ``tests/test_certification_exact.py`` and
``tests/test_zoo.py`` (``FAMILY.fixture``)."""

from __future__ import annotations

import json
import math
from functools import partial

import pytest
import torch
from omegaconf import OmegaConf

from eagle2.bench.methods import build_drafter
from eagle2.core.features import LayerTap
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


# ---- properties the mutation audit (experiments/audit/mutations_new_drafters.py) found unguarded ----

def rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@torch.no_grad()
def test_forward_is_z_labs_block_by_hand(models):
    """One block, every position visible, written out from the weights: context = RMSNorm(fc(taps)); per layer,
    queries of the normed block, keys and values of [context; normed block], q_norm/k_norm per head, RoPE,
    softmax attention, o_proj, residual; then the MLP with its residual; the final norm."""
    from transformers.models.llama.modeling_llama import rotate_half

    target, head = models
    taps = one_forward.taps_of(target, head.feature_layers, [3, 9, 4, 11])
    ids, eps = torch.tensor([[11] + [head.mask_token_id] * 4]), head.config.rms_norm_eps
    positions = torch.arange(taps.shape[0] + 5)[None]
    x = target.get_input_embeddings()(ids)[0].float()
    context = rms(taps.float() @ head.fc.weight.float().T, head.hidden_norm.weight, eps)
    cos, sin = (t[0] for t in head.rotary_emb(x[None], position_ids=positions))
    for layer in head.layers:
        a, hd = layer.self_attn, layer.self_attn.head_dim
        h = rms(x, layer.input_layernorm.weight, eps)
        both = torch.cat([context, h])
        q = rms((h @ a.q_proj.weight.T).view(5, -1, hd), a.q_norm.weight, eps).transpose(0, 1)
        k = rms((both @ a.k_proj.weight.T).view(len(both), -1, hd), a.k_norm.weight, eps).transpose(0, 1)
        v = (both @ a.v_proj.weight.T).view(len(both), -1, hd).transpose(0, 1)
        q, k = q * cos[-5:] + rotate_half(q) * sin[-5:], k * cos + rotate_half(k) * sin
        k, v = (t.repeat_interleave(q.shape[0] // k.shape[0], 0) for t in (k, v))
        attended = torch.softmax(q @ k.transpose(1, 2) / hd ** 0.5, -1) @ v
        x = x + attended.transpose(0, 1).reshape(5, -1) @ a.o_proj.weight.T
        x = x + layer.mlp(rms(x, layer.post_attention_layernorm.weight, eps))
    out = head(ids, taps[None], position_ids=positions)[0]
    torch.testing.assert_close(out, rms(x, head.norm.weight, eps), atol=1e-5, rtol=1e-4)


def test_loss_is_each_slots_decayed_cross_entropy_on_the_token_it_stands_for(models):
    """By hand, every candidate anchor a a block: slot k fitted to token t[a + k], counted when that token is an
    answer token inside the row, weighted exp(-(k - 1) / gamma), the weighted mean."""
    target, _ = models
    head = tiny_dflash_head(target, seed=2, block_size=4).float()
    tokens = torch.randint(32, (1, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad(), LayerTap(target, head.feature_layers) as tap:
        target(tokens)
        taps = tap.read()
    batch = {"tokens": tokens, "layer_features": taps, "features": taps, "valid": torch.ones_like(tokens).bool(),
             "start": torch.tensor([5])}
    loss, _ = dflash_loss(head, batch, num_anchors=64, gamma=2.0, with_stats=False)
    anchors = torch.arange(4, 11)  # token a + 1 is an answer token (start 5)
    out = block_forward(head, tokens[0], taps[0], anchors)
    total = weights = 0.0
    for i, a in enumerate(anchors.tolist()):
        for k in range(1, 4):
            if a + k <= 11:
                ce = torch.nn.functional.cross_entropy(head.logits(out[i, k])[None], tokens[0, a + k][None])
                total, weights = total + math.exp(-(k - 1) / 2.0) * ce, weights + math.exp(-(k - 1) / 2.0)
    torch.testing.assert_close(loss, total / weights, atol=1e-5, rtol=1e-5)
