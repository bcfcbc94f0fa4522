"""Streamed corpus shards (``data.ShardedSequences``, ``train.*.resident_shards``): the same sequences as
loading every shard, an epoch that reads each shard once with at most ``resident`` in memory, and training
that resumes exactly; on a tiny random target's corpus of 8 shards (CPU, seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagle2.training.data import (
    ShardedSequences,
    load_sequences,
    make_batches,
    shard_local_batches,
    split_shards,
    train_val_sequences,
)
from eagle2.training.objectives.eagle import train_head
from tests.test_training import assert_resume_matches_uninterrupted, head_cfg, tiny_corpus, tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def corpus(target, tmp_path_factory) -> Path:
    return tiny_corpus(target, tmp_path_factory.mktemp("stream_corpus"), batch_size=2)  # 8 shards


def test_streamed_sequences_equal_the_loaded_ones(corpus):
    paths = split_shards(corpus, 0.0)[0]
    loaded, streamed = load_sequences(paths), ShardedSequences(paths, resident=2)
    assert len(paths) == 8 and len(streamed) == len(loaded) == 16
    assert streamed.lengths == [len(s.tokens) for s in loaded]
    for i in reversed(range(len(loaded))):  # any order
        a, b = loaded[i], streamed[i]
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.features, b.features) and a.start == b.start
        assert len(streamed._cache) <= 2
    picked = streamed.select([1, 5, 9])
    assert isinstance(picked, ShardedSequences) and torch.equal(picked[1].tokens, loaded[5].tokens)


def _epoch_reads(seqs: ShardedSequences, batches: list[list[int]]) -> int:
    """Shards read while training on ``batches`` in order (the cache never holding more than allowed)."""
    seqs._cache.clear()
    before = seqs.loads
    for batch in batches:
        for i in batch:
            seqs[i]
            assert len(seqs._cache) <= seqs.resident
    return seqs.loads - before


@pytest.mark.parametrize("resident", [1, 2, 3])
def test_an_epoch_reads_each_shard_once_with_at_most_resident_in_memory(corpus, resident):
    seqs = ShardedSequences(split_shards(corpus, 0.0)[0], resident=resident)
    for epoch in range(3):
        batches = shard_local_batches(seqs.shard_of, seqs.lengths, 256, 4, seed=0, epoch=epoch, resident=resident)
        assert sorted(i for b in batches for i in b) == list(range(len(seqs)))  # every sequence once
        assert all(len({seqs.shard_of[i] for i in b}) <= resident for b in batches)
        assert _epoch_reads(seqs, batches) == 8
    assert batches != shard_local_batches(seqs.shard_of, seqs.lengths, 256, 4, seed=0, epoch=0, resident=resident)


def test_batches_drawn_over_every_shard_would_read_shards_again_and_again(corpus):
    """Negative control: the in-memory batch order (``make_batches`` over all sequences) streamed with
    one shard resident reads shards far more often than once each."""
    seqs = ShardedSequences(split_shards(corpus, 0.0)[0], resident=1)
    assert _epoch_reads(seqs, make_batches(seqs.lengths, 256, 4, seed=0, epoch=0)) > 8


def test_streamed_training_resumes_exactly(target, corpus, tmp_path):
    cfg = head_cfg(epochs=2, resident_shards=2)
    train, _, _ = train_val_sequences(corpus, cfg.val_fraction, None, cfg.resident_shards)
    assert isinstance(train, ShardedSequences)
    assert_resume_matches_uninterrupted(train_head, target, corpus, cfg, tmp_path)
    state = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert state["fingerprint"]["resident_shards"] == 2
