"""One definition of agreement (``eagle2.training.evaluation.agreement``): a hand-made case worked out by hand, and
the trainer's own validation figures equal to the eval stage's on the same held-out sequences (EAGLE-2
and EAGLE-3 heads on tiny random targets, the trainer's loss in bf16, the evaluator's in fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from eagle2.core.features import eagle3_layers
from eagle2.heads.eagle3_head import load_eagle3_head, save_eagle3_head
from eagle2.heads.eagle_head import load_head, save_head
from eagle2.training.corpora.prompts import build_corpus
from eagle2.training.data import load_sequences, split_shards
from eagle2.training.evaluation.agreement import (
    Tally,
    accepted_lengths,
    agreement,
    chain_summary,
    counted_positions,
)
from eagle2.training.objectives.eagle import evaluate_head, train_head
from eagle2.training.objectives.eagle3 import evaluate_eagle3_head, train_eagle3_head
from tests.test_training import PROMPTS, ByteTokenizer, head_cfg, tiny_target


def test_hand_made_agreement_and_chain():
    # 4 positions over a 5-token draft vocabulary; the draft's ranking per row, best first:
    logits = torch.tensor([[0.0, 5, 4, 3, 2],     # ranks draft indices 1 2 3 4 0
                           [9.0, 1, 2, 3, 4],     # 0 4 3 2 1
                           [0.0, 0.5, -1, 1, 2],  # 4 3 1 0 2
                           [3.0, 2, 1, 0, -1]])   # 0 1 2 3 4
    target = torch.zeros(4, 7)  # the target's vocabulary is larger: 7 tokens
    for row, tok in enumerate([1, 3, 2, 6]):
        target[row, tok] = 1.0
    # draft vocabulary = target ids 0..4: row 0 hit at rank 1, row 1 at rank 3, row 2 at rank 5 (not in
    # the top 4), row 3 wants token 6, outside the draft vocabulary: a miss, still counted
    stats = agreement(logits, target, ks=(1, 2, 4), vocab_ids=torch.arange(5))
    assert stats == {"top1": 1 / 4, "top2": 1 / 4, "top4": 2 / 4, "n": 4}
    # a restricted draft vocabulary: draft index i is target token ids[i]; token 6 is now drafted
    ids = torch.tensor([1, 6, 2, 3, 0])
    stats = agreement(logits, target, ks=(1, 4), vocab_ids=ids)
    # row 0 ranks 6 2 3 0 1 (wants 1: miss), row 1 ranks 1 0 3 2 (wants 3: top4), row 2 ranks 0 3 6 1 2
    # (wants 2: miss), row 3 ranks 1 6 2 3 (wants 6: top4)
    assert stats == {"top1": 0.0, "top4": 2 / 4, "n": 4}
    # the mask drops rows: only rows 1 and 3 counted
    assert agreement(logits, target, torch.tensor([False, True, False, True]), ks=(1, 4),
                     vocab_ids=ids) == {"top1": 0.0, "top4": 1.0, "n": 2}

    # counted positions: head position j counts when f[j+1] is an answer position (j + 1 >= start)
    valid = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    mask = counted_positions(valid, torch.tensor([3, 1]))
    assert mask.tolist() == [[False, False, True, True, True], [True, True, True, False, False]]

    # chains of depth 3: accepted lengths 0, 3, 1, 2 -> P(>=1) = 3/4, P(>=2) = 2/4, P(>=3) = 1/4
    drafted = torch.tensor([[5, 1, 1], [1, 2, 3], [1, 9, 3], [4, 4, 0]])
    truth = torch.tensor([[1, 1, 1], [1, 2, 3], [1, 2, 3], [4, 4, 4]])
    lengths = accepted_lengths(drafted, truth)
    assert lengths.tolist() == [0, 3, 1, 2]
    chain = chain_summary(lengths, 3)
    assert chain["anchors"] == 4 and chain["accept_ge"] == {"1": 0.75, "2": 0.5, "3": 0.25}
    assert chain["tau"] == pytest.approx(2.5)

    # per-token means over batches; a step's figure weighted by its own count
    tally = Tally()
    tally.add({"top1": 1.0, "top1_s2": 0.0, "n_s2": 1, "n": 3})
    tally.add({"top1": 0.0, "top1_s2": 1.0, "n_s2": 3, "n": 1})
    assert tally.means() == {"top1": 0.75, "top1_s2": 0.75, "positions": 4}


@pytest.fixture(scope="module")
def target2():
    return tiny_target()


@pytest.fixture(scope="module")
def target3():
    return tiny_target(seed=1, layers=6)


def _corpus(target, out: Path, taps=()) -> Path:
    build_corpus(target, ByteTokenizer(), PROMPTS, out, template="vicuna", system_prompt="S", batch_size=4,
                 max_new_tokens=16, max_prompt_tokens=128, temperature=0.0, samples_per_prompt=1, seed=0,
                 tap_layers=taps)
    return out


def _eval_cfg(max_sequences: int):
    return OmegaConf.create({"depth": 3, "stride": 2, "max_anchors_per_sequence": 8, "max_sequences": max_sequences,
                             "token_budget": 4096, "max_batch": 32})


def _assert_same(val: dict, tf: dict) -> None:
    assert val["positions"] == tf["positions"] > 0
    for key in ("top1", "top4"):
        assert val[key] == pytest.approx(tf[key], abs=1e-9), key
    assert val["cls"] == pytest.approx(tf["cls"], rel=1e-5)


def test_trainer_validation_equals_eval_stage_eagle2(target2, tmp_path):
    corpus = _corpus(target2, tmp_path / "corpus")
    # bf16 training loss, a different batch budget and a subset of the held-out sequences: the
    # trainer's validation still reports what the eval stage reports on those sequences
    cfg = head_cfg(epochs=2, loss_dtype="bfloat16", val_max_sequences=3, token_budget=128)
    head, summary = train_head(target2, corpus, cfg, tmp_path / "run")
    folder = save_head(head, tmp_path / "eagle_head")
    seqs = load_sequences(split_shards(corpus, cfg.val_fraction)[1])
    assert len(seqs) > 3
    metrics = evaluate_head(load_head(folder, target2), target2, seqs, _eval_cfg(3))
    _assert_same(summary["val"], metrics["teacher_forced"])


def test_trainer_validation_equals_eval_stage_eagle3(target3, tmp_path):
    corpus = _corpus(target3, tmp_path / "corpus", eagle3_layers(6))
    cfg = head_cfg(epochs=2, loss_dtype="bfloat16", val_max_sequences=3, token_budget=128, draft_vocab_size=40,
                   unroll=2, unroll_cls_fraction=0.5)
    head, summary = train_eagle3_head(target3, corpus, cfg, tmp_path / "run")
    folder = save_eagle3_head(head, tmp_path / "eagle3_head")
    seqs = load_sequences(split_shards(corpus, cfg.val_fraction)[1])
    metrics = evaluate_eagle3_head(load_eagle3_head(folder, target3), target3, seqs, _eval_cfg(3))
    _assert_same(summary["val"], metrics["teacher_forced"])
    assert 0.0 <= summary["val"]["top1_s2"] <= 1.0
