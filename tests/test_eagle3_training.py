"""Training EAGLE-3 heads: the corpus records the tapped layers, the loss trains, the head exports in the
official layout and resumes; on a tiny random 6-layer Llama (CPU, seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagle2.core.features import eagle3_layers
from eagle2.heads.eagle3_head import load_eagle3_head, save_eagle3_head
from eagle2.training.corpora.prompts import build_corpus
from eagle2.training.data import all_sequences
from eagle2.training.objectives.eagle3 import draft_vocabulary_ids, evaluate_eagle3_head, train_eagle3_head
from eagle2.training.shards import read_shards
from tests.test_training import (
    PROMPTS,
    ByteTokenizer,
    assert_resume_matches_uninterrupted,
    head_cfg,
    tiny_target,
    train_losses,
)

LAYERS = eagle3_layers(6)


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=1, layers=6)


@pytest.fixture(scope="module")
def corpus(target, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("corpus3")
    build_corpus(target, ByteTokenizer(), PROMPTS, out, template="vicuna", system_prompt="S", batch_size=4,
                 max_new_tokens=16, max_prompt_tokens=128, temperature=0.0, samples_per_prompt=1, seed=0,
                 tap_layers=LAYERS)
    return out


def eagle3_cfg(**over):
    return head_cfg(**{"draft_vocab_size": 48, "unroll": 2, "unroll_cls_fraction": 1.0, "lr": 3e-3, **over})


def test_corpus_records_the_tapped_layers_of_every_position(target, corpus):
    shard = read_shards(corpus)[0]
    assert shard["tap_layers"].tolist() == list(LAYERS)
    seq = all_sequences(corpus)[0]
    with torch.no_grad():  # the whole sequence again, teacher-forced: same features at every position
        hs = target(seq.tokens[None], output_hidden_states=True).hidden_states
    expected = torch.cat([hs[i] for i in LAYERS], dim=-1)[0]
    torch.testing.assert_close(seq.layer_features.float(), expected, atol=2e-3, rtol=2e-3)  # stored in fp16
    assert seq.layer_features.shape == (len(seq.tokens), 3 * target.config.hidden_size)


def test_draft_vocabulary_takes_frequent_answer_tokens_and_has_its_size(corpus):
    ids = draft_vocabulary_ids(corpus, 48, 64)
    assert len(ids) == len(torch.unique(ids)) == 48
    answers = torch.cat([s.tokens[s.start:] for s in all_sequences(corpus)])
    counts = torch.bincount(answers, minlength=64)
    assert counts[ids[0]] == counts.max()  # most frequent first


def test_eagle3_training_learns_exports_and_evaluates(target, corpus, tmp_path):
    head, summary = train_eagle3_head(target, corpus, eagle3_cfg(epochs=8), tmp_path / "run")
    losses = train_losses(tmp_path / "run")
    steps = sorted(losses)
    assert sum(losses[s] for s in steps[-3:]) < 0.6 * sum(losses[s] for s in steps[:3])
    folder = save_eagle3_head(head, tmp_path / "head")
    loaded = load_eagle3_head(folder, target)
    for key, value in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key].to(value.dtype), value)
    seqs = all_sequences(corpus)
    cfg = head_cfg(depth=3, stride=2, max_anchors_per_sequence=8, max_sequences=None)
    trained = evaluate_eagle3_head(loaded, target, seqs, cfg)
    fresh, _ = train_eagle3_head(target, corpus, eagle3_cfg(max_steps=1, lr=1e-9), tmp_path / "fresh")
    untrained = evaluate_eagle3_head(fresh, target, seqs, cfg)
    assert trained["teacher_forced"]["top1"] > untrained["teacher_forced"]["top1"] + 0.2
    assert trained["chain"]["tau"] > untrained["chain"]["tau"]


def test_eagle3_resume_after_stop_matches_uninterrupted(target, corpus, tmp_path):
    assert_resume_matches_uninterrupted(train_eagle3_head, target, corpus, eagle3_cfg(epochs=2), tmp_path)


def test_corpus_resumes_only_with_the_same_taps(target, corpus):
    with pytest.raises(ValueError, match="tap_layers"):
        build_corpus(target, ByteTokenizer(), PROMPTS, corpus, template="vicuna", system_prompt="S", batch_size=4,
                     max_new_tokens=16, max_prompt_tokens=128, temperature=0.0, samples_per_prompt=1, seed=0)
