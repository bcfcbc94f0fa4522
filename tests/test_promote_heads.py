"""Promoting a joint run's heads (experiments/research/snapshot_heads.py: promote): with both heads named, both
folders take the state's weights and their cards and resume.json carry the digest of all of them; with one head
named, that head alone takes its weights, its card carries the digest of its own weights, the other head's folder
is left byte for byte, and resume.json is not touched (resuming still needs the state's weights)."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from eagle2.heads.eagle3_head import save_eagle3_head
from eagle2.heads.eagle_head import save_head
from eagle2.training.support.warm_state import weights_digest
from experiments.research.snapshot_heads import promote
from tests.conftest import tiny_eagle3_head, tiny_head, tiny_llama


def joint_state(tmp_path):
    """Two head folders a joint run started from, and a state whose weights are theirs nudged."""
    target = tiny_llama(vocab=64, layers=6, hidden=32)
    heads = {"heads.head.": tiny_head(target, seed=1),
             "heads.eagle3.": tiny_eagle3_head(target, seed=2, draft_vocab_size=40)}
    folders = {"heads.head.": save_head(heads["heads.head."], tmp_path / "eagle_head"),
               "heads.eagle3.": save_eagle3_head(heads["heads.eagle3."], tmp_path / "eagle3_head")}
    stored = {prefix + k: (v.float() + 0.25).to(torch.bfloat16) for prefix, head in heads.items()
              for k, v in head.named_parameters()}
    state = tmp_path / "state"
    state.mkdir()
    save_file(stored, str(state / "trainable.safetensors"))
    position = {"step": 30, "epoch": 0, "tokens_trained": 1000, "weights_sha256": weights_digest(stored)}
    (state / "resume.json").write_text(json.dumps(position) + "\n")
    return target, folders, stored, state


def test_one_head_is_promoted_alone(tmp_path):
    target, folders, stored, state = joint_state(tmp_path)
    other = {p.name: p.read_bytes() for p in folders["heads.head."].iterdir()}
    before = (state / "resume.json").read_text()
    digest = promote(state, {"heads.eagle3.": folders["heads.eagle3."]}, target)
    own = {k: v for k, v in stored.items() if k.startswith("heads.eagle3.")}
    assert digest == weights_digest(own) != weights_digest(stored)
    card = json.loads((folders["heads.eagle3."] / "training.json").read_text())
    assert card["promoted_from"]["weights_sha256"] == digest and card["promoted_from"]["step"] == 30
    assert {p.name: p.read_bytes() for p in folders["heads.head."].iterdir()} == other
    assert (state / "resume.json").read_text() == before


def test_both_heads_promoted_record_the_states_digest(tmp_path):
    target, folders, stored, state = joint_state(tmp_path)
    digest = promote(state, folders, target)
    assert digest == weights_digest(stored)
    assert json.loads((state / "resume.json").read_text())["weights_sha256"] == digest
    for folder in folders.values():
        assert json.loads((folder / "training.json").read_text())["promoted_from"]["weights_sha256"] == digest
