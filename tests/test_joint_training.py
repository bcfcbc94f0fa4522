"""Joint training (``eagle2/training/objectives/joint.py``): one target forward feeds the EAGLE and the EAGLE-3
head, and each head ends exactly where its own run on the same batches ends; the teacher-forced forward on a
bf16 copy of the target's weights (tiny random targets, seconds)."""

from __future__ import annotations

import json

import torch
from omegaconf import OmegaConf

from eagle2.training.data import collate, split_shards, token_sequences
from eagle2.training.features import OnlineFeatures, body_dtype
from eagle2.training.objectives.eagle import train_head
from eagle2.training.objectives.eagle3 import train_eagle3_head
from eagle2.training.objectives.joint import train_joint
from tests.test_online_features import token_corpus  # noqa: F401  (the fixture)
from tests.test_training import head_cfg, tiny_target


def _sections(**loop):
    """Head, EAGLE-3 and loop settings with nothing random but the batch order (no jitter, every position in
    the unrolled steps) and clipping that bites, so the comparison with separate runs is exact."""
    common = dict(autocast="off", target_dtype="same", noise=0.0, grad_clip=0.05, epochs=2, seed=3)
    head = head_cfg(**common)
    eagle3 = head_cfg(**common, draft_vocab_size=40, unroll=2, unroll_cls_fraction=1.0, step_decay=1.0)
    joint = head_cfg(**common, primary="eagle3", **loop)
    return OmegaConf.create({"head": head, "eagle3": eagle3, "joint": joint})


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
