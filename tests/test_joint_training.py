"""Joint training (``eagle2/training/objectives/joint.py``): one target forward feeds the EAGLE and the EAGLE-3
head, and each head ends exactly where its own run on the same batches ends; any set of members (``head``,
``eagle3``, ``hass`` and a test-declared EAGLE-3.1 head tapping other layers) from one forward per step, each
member's loss its solo objective's on the same batch, exact resume, exports through each family; the
teacher-forced forward on a bf16 copy of the target's weights (tiny random targets, seconds)."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from analysis.learning_curve import plot_curves, run_rows
from eagle2.core.features import eagle3_layers
from eagle2.heads.family import families
from eagle2.training.data import all_sequences, collate, split_shards, token_sequences
from eagle2.training.evaluation.evaluate import chain_tau_measure
from eagle2.training.features import OnlineFeatures, body_dtype, tokens_to_features
from eagle2.training.objectives import Member, objectives
from eagle2.training.objectives.eagle import train_head
from eagle2.training.objectives.eagle3 import eagle3_setup, export_eagle3, train_eagle3_head
from eagle2.training.objectives.joint import (
    JointHeads,
    head_taps,
    joint_chains,
    joint_loss,
    joint_members,
    joint_stage,
    train_joint,
)
from tests.test_online_features import token_corpus  # noqa: F401  (the fixture)
from tests.test_training import head_cfg, tiny_target


def _sections(**loop):
    """Head, EAGLE-3, HASS, EAGLE-3.1 (tapping layers 1, 2, 3) and loop settings with nothing random but the batch
    order (no jitter, every position in the unrolled steps) and clipping that bites, so the comparison with
    separate runs is exact."""
    common = dict(autocast="off", target_dtype="same", noise=0.0, grad_clip=0.05, epochs=2, seed=3)
    head = head_cfg(**common)
    eagle3 = head_cfg(**common, draft_vocab_size=40, unroll=2, unroll_cls_fraction=1.0, step_decay=1.0)
    hass = head_cfg(**{**common, "seed": 5}, unroll=2, detach_unroll=True, top_k=4, w_topk=0.0,
                    topk_phase={"w_topk": 1.0, "max_steps": 2})
    eagle31 = head_cfg(**{**common, "seed": 7}, draft_vocab_size=40, unroll=2, unroll_cls_fraction=1.0,
                       taps=[1, 2, 3], eagle31_norms=True)
    peagle = head_cfg(**{**common, "seed": 9}, draft_vocab_size=40, para_depths=3, down_sample_ratio=1.0,
                      down_sample_ratio_min=1.0)  # every anchor at every depth: nothing random
    dflash = head_cfg(**{**common, "seed": 11}, layers=1, block_size=4, num_anchors=1000, loss_decay_gamma=4.0,
                      taps=None)  # every anchor: nothing random
    joint = head_cfg(**common, primary="eagle3", **loop)
    return OmegaConf.create({"head": head, "eagle3": eagle3, "hass": hass, "eagle31": eagle31,
                             "peagle_head": peagle, "dflash_head": dflash, "joint": joint})


# an objective declared by the test alone: an EAGLE-3.1 head tapping other layers than the EAGLE-3 head's
MEMBERS = {o.stage: o.member for o in objectives().values() if o.member is not None} | {
    "eagle31": Member(eagle3_setup, export_eagle3)}


def _weights(module):
    return {k: v.clone() for k, v in module.state_dict().items() if "embed" not in k and "rotary" not in k}


def test_joint_heads_end_where_their_own_runs_end(token_corpus, tmp_path):  # noqa: F811
    target = tiny_target(layers=4)
    cfg = _sections()
    heads, summary = train_joint(target, token_corpus, cfg, tmp_path / "joint")
    alone = {"head": train_head(target, token_corpus, cfg.head, tmp_path / "head")[0],
             "eagle3": train_eagle3_head(target, token_corpus, cfg.eagle3, tmp_path / "eagle3")[0]}
    assert summary["step"] >= 6
    for name, head in heads.items():
        mine, theirs = _weights(head), _weights(alone[name])
        assert mine.keys() == theirs.keys()
        for key in mine:
            torch.testing.assert_close(mine[key], theirs[key], atol=1e-6, rtol=1e-5,
                                       msg=lambda m, n=name, k=key: f"{n} {k}: {m}")
    rows = [json.loads(line) for line in (tmp_path / "joint" / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if r["split"] == "train"][-1]
    assert last["top1"] == last["eagle3/top1"] and "head/top1" in last and "eagle3/top1_s2" in last
    ckpt = torch.load(tmp_path / "joint" / "checkpoint.pt", weights_only=True)
    assert set(ckpt["fingerprint"]["joint"]) == {"head", "eagle3"} and ckpt["fingerprint"]["features"] == "online"
    assert not any(k.endswith("embed_tokens.weight") for k in ckpt["model"])  # the target's weights stay out


def test_the_bf16_body_keeps_the_target_and_its_rotary_tables(token_corpus):  # noqa: F811
    target = tiny_target(layers=4)
    seqs = token_sequences(split_shards(token_corpus, 0.25, "tokens_*.npz")[0])
    featurize = OnlineFeatures(target, (1, 2), None, torch.bfloat16)
    assert featurize.body is not target.base_model and featurize.dtype is None
    assert all(p.dtype == torch.float32 for p in target.parameters())  # the target itself is untouched
    assert all(p.dtype == torch.bfloat16 for p in featurize.body.parameters())
    assert all(b.dtype == torch.float32 for n, b in featurize.body.named_buffers() if "inv_freq" in n)
    fast = featurize(collate(seqs[:4], "cpu"))
    exact = OnlineFeatures(target, (1, 2))(collate(seqs[:4], "cpu"))
    valid = exact["valid"]
    for key in ("features", "layer_features"):
        assert fast[key].dtype == torch.float32
        torch.testing.assert_close(fast[key][valid], exact[key][valid], atol=0.1, rtol=0.05)
    assert body_dtype("same", torch.device("cpu")) is None and body_dtype("bf16", torch.device("cpu")) == torch.bfloat16


def _grads(module) -> dict[str, torch.Tensor]:
    grads = {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}
    module.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("loss_dtype", ["float32", "bfloat16"])
def test_every_member_loss_is_its_solo_loss_on_the_same_batch(token_corpus, loss_dtype):  # noqa: F811
    """Members tapping different layers (EAGLE-3 and P-EAGLE: 2, 2, 1; EAGLE-3.1: 1, 2, 3) share one forward over
    their union and each reads its own layers, and the target's logits are computed once for all of them
    (``target_logits.share_target_logits``: the full vocabulary, each member's vocabulary its columns; the EAGLE
    head's a cls vocabulary of 48, the EAGLE-3 heads' 40): each member's loss and gradients are those its own
    objective gives on a batch featurized for it, the loss in fp32 and in bf16 LM-head products."""
    target = tiny_target(layers=4)
    cfg = _sections(heads=["head", "eagle3", "hass", "eagle31", "peagle_head", "dflash_head"])
    cfg.head.cls_vocab_size = 48
    for name in cfg.joint.heads:
        cfg[name].loss_dtype = loss_dtype
    heads, losses = {}, {}
    for name, member in joint_members(cfg, MEMBERS).items():
        heads[name], losses[name], _ = member.setup(target, token_corpus, cfg[name])
    module = JointHeads(heads, primary="eagle3")
    assert module.tap_layers() == (2, 1, 3) and head_taps(heads["eagle31"]) == (1, 2, 3)
    assert heads["head"].draft_vocab is not None  # (the restricted EAGLE vocabulary is in play)
    raw = collate(token_sequences(split_shards(token_corpus, 0.25, "tokens_*.npz")[0])[:4], "cpu")
    joint_batch = OnlineFeatures(target, module.tap_layers())(dict(raw))
    tol = {"rel": 1e-6, "abs": 1e-7} if loss_dtype == "float32" else {"rel": 1e-3, "abs": 1e-4}
    for train in (True, False):
        total, stats = joint_loss(module, joint_batch, losses=losses, train=train)
        total.backward()
        joint_grads = {name: _grads(head) for name, head in heads.items()}
        for name, head in heads.items():
            solo_batch = OnlineFeatures(target, head_taps(head))(dict(raw))
            solo, _ = losses[name](head, solo_batch, train=train)
            assert stats[f"{name}/loss"] == pytest.approx(float(solo.detach()), **tol), (name, train)
            solo.backward()
            solo_grads = _grads(head)
            assert solo_grads.keys() == joint_grads[name].keys() and solo_grads, name
            for key, grad in solo_grads.items():
                torch.testing.assert_close(joint_grads[name][key], grad, rtol=tol["rel"] * 10, atol=tol["abs"] * 10,
                                           msg=lambda m, n=name, k=key, t=train: f"{n} {k} (train={t}): {m}")


def test_three_members_from_one_target_forward_per_step(token_corpus, tmp_path):  # noqa: F811
    target = tiny_target(layers=4)
    cfg = _sections(heads=["head", "eagle3", "hass"], val_every=3)
    forwards = [0]
    target.base_model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    marks = []

    def on_step(step, stats):
        marks.append(forwards[0])

    train_joint(target, token_corpus, cfg, tmp_path / "joint", on_step=on_step)
    val_batches = {}  # the forwards of a validation (one per held-out batch) fall between two steps
    rows = [json.loads(line) for line in (tmp_path / "joint" / "metrics.jsonl").read_text().splitlines()]
    val_steps = {r["step"] for r in rows if r["split"] == "val"}
    per_step = [b - a for a, b in zip([0] + marks, marks)]
    for step, count in enumerate(per_step):  # step s (from 0) ends as step s + 1
        if step not in val_steps:
            assert count == 1, f"step {step + 1}: {count} target forwards"
        else:
            val_batches[step] = count - 1
    assert len(per_step) >= 6 and len(set(val_batches.values())) <= 1
    val = [r for r in rows if r["split"] == "val"]
    assert val and all(f"{name}/top1" in r for r in val for name in ("head", "eagle3", "hass"))
    assert all(r["top1"] == r["eagle3/top1"] for r in val)
    train_rows = [r for r in rows if r["split"] == "train"]
    assert all(f"{name}/loss" in r for r in train_rows for name in ("head", "eagle3", "hass"))
    runs = {name: run_rows(f"{tmp_path / 'joint'}@{name}/top1", "top1") for name in ("head", "eagle3", "hass")}
    assert all(len(r) == len(val) for r in runs.values())
    assert plot_curves(runs, tmp_path / "curve.png").exists()


def test_a_joint_run_resumes_exactly(token_corpus, tmp_path):  # noqa: F811
    target = tiny_target(layers=4)
    cfg = _sections(heads=["head", "eagle3", "hass"])
    whole, summary = train_joint(target, token_corpus, cfg, tmp_path / "whole")
    part, partial_summary = train_joint(target, token_corpus, cfg, tmp_path / "legs", stop_after=3)
    assert partial_summary["partial"] and partial_summary["step"] == 3
    legs, resumed = train_joint(target, token_corpus, cfg, tmp_path / "legs")
    assert resumed["step"] == summary["step"] > 3
    for name in whole:
        mine, theirs = _weights(legs[name]), _weights(whole[name])
        for key in mine:
            assert torch.equal(mine[key], theirs[key]), f"{name} {key}"
    rows = lambda d: [r for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())]  # noqa: E731
    assert [r["step"] for r in rows(tmp_path / "legs")] == [r["step"] for r in rows(tmp_path / "whole")]


def test_the_joint_stage_exports_each_member_through_its_family(token_corpus, tmp_path):  # noqa: F811
    target = tiny_target(layers=4)
    sections = _sections(heads=["head", "eagle3", "hass"], max_steps=2, out_dir=str(tmp_path / "run"),
                         stop_after=None)
    export = {"head": str(tmp_path / "eagle"), "eagle3_head": str(tmp_path / "eagle3"),
              "hass_head": str(tmp_path / "hass"), "head_max_mb": 5, "eagle3_head_max_mb": 5, "hass_head_max_mb": 5,
              "dtype": "float32"}
    cfg = OmegaConf.create({"model": {"name": "tiny"}, "train": {**sections, "export": export,
                                                                   "corpus": {"out_dir": str(token_corpus)}}})
    folders = joint_stage(target, None, cfg, tmp_path)
    assert [f.name for f in folders] == ["eagle", "eagle3", "hass"]
    for folder, key in zip(folders, ("head", "eagle3_head", "hass_head")):
        assert families()[key].load(folder, target) is not None
        assert json.loads((folder / "training.json").read_text())["trained_in"] == "joint"


def test_joint_members_are_checked_in_one_line():
    cfg = _sections()
    assert list(joint_members(cfg)) == ["head", "eagle3"]  # the default: today's pair
    for heads, says in ((["head", "medusa"], "cannot join"), (["head", "nothere"], "cannot join"),
                        (["head", "hass", "head"], "twice"), (["head", "hass"], "primary")):
        with pytest.raises(ValueError, match=says):
            joint_members(_sections(heads=heads))
    without = OmegaConf.create({k: v for k, v in cfg.items() if k != "hass"} | {
        "joint": {**cfg.joint, "heads": ["eagle3", "hass"]}})
    with pytest.raises(ValueError, match="no train.hass section"):
        joint_members(without)


def test_validation_measures_each_members_chain_tau(token_corpus, tmp_path):  # noqa: F811
    """``val_set: mtbench``'s measure on a joint run: each member's greedy-chain tau under its name, the
    primary's also as ``chain_tau``, each what the member's own chain measure gives."""
    target = tiny_target(layers=4)
    cfg = _sections(heads=["head", "eagle3", "hass"])
    members = joint_members(cfg)
    heads = {name: member.setup(target, token_corpus, cfg[name])[0] for name, member in members.items()}
    module = JointHeads(heads, primary="eagle3")
    seqs = all_sequences(tokens_to_features(target, token_corpus, tmp_path / "held", pad_id=0,
                                            tap_layers=eagle3_layers(4)))[:6]
    ev = OmegaConf.create({"depth": 3, "stride": 2, "max_anchors_per_sequence": 8})
    taus = chain_tau_measure(joint_chains(members), target, seqs, ev)(module)
    assert set(taus) == {"chain_tau", "head/chain_tau", "eagle3/chain_tau", "hass/chain_tau"}
    assert taus["chain_tau"] == taus["eagle3/chain_tau"]
    for name, member in members.items():
        assert taus[f"{name}/chain_tau"] == chain_tau_measure(member.chain, target, seqs, ev)(heads[name])["chain_tau"]
