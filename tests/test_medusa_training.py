"""Medusa training and evaluation (``eagle2.training.objectives.medusa``) on a tiny random target: which
positions each head learns from, that training lowers the loss, and the rank statistics behind the
held-out top-1 per head and the tree choice."""

from __future__ import annotations

from collections import Counter

import torch
from omegaconf import OmegaConf

from eagle2.training.data import Sequence, collate
from eagle2.training.loop import fit
from eagle2.training.objectives.medusa import (
    best_tree,
    medusa_loss,
    medusa_targets,
    new_medusa_heads,
    rank_statistics,
    tree_accept_length,
    true_ranks,
)
from eagle2.training.support.losses import LossProjection
from tests.conftest import tiny_llama

FIT = {"lr": 3e-2, "betas": [0.9, 0.95], "weight_decay": 0.0, "warmup": 2, "min_lr_ratio": 0.1, "epochs": 40,
       "max_steps": 40, "token_budget": 256, "max_batch": 8, "grad_clip": 1.0, "seed": 0, "checkpoint_every": 1000,
       "log_every": 10, "val_every": None, "val_max_sequences": None}


def sequences(target, n: int = 8, length: int = 24, seed: int = 0) -> list[Sequence]:
    """Greedy continuations of random prompts with the target's post-norm features (a corpus in small)."""
    g = torch.Generator().manual_seed(seed)
    seqs = []
    with torch.no_grad():
        for _ in range(n):
            ids = torch.randint(2, target.config.vocab_size, (4,), generator=g).tolist()
            out = target.generate(torch.tensor([ids]), max_new_tokens=length - 4, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)[0]
            feats = target.model(out[None]).last_hidden_state[0]
            seqs.append(Sequence(out, feats, 4))
    return seqs


def test_head_k_learns_from_drafting_positions_only():
    valid = torch.tensor([[True] * 6 + [False] * 2])
    start = torch.tensor([3])
    # head 0 at t reads f[t] and is fitted to f[t+1]: t from the prompt's last position (2), f[t+1] valid
    assert medusa_targets(8, start, valid, 0).tolist() == [[False, False, True, True, True, False, False]]
    assert medusa_targets(8, start, valid, 2).tolist() == [[False, False, True, False, False]]


def test_training_lowers_the_loss_and_raises_agreement(tmp_path):
    target = tiny_llama(vocab=16, layers=1, seed=0, scale=10.0)
    target.requires_grad_(False)
    seqs = sequences(target)
    heads = new_medusa_heads(target, num_heads=2)
    proj = LossProjection(target.lm_head)
    batch = collate(seqs, "cpu")
    before = medusa_loss(heads, batch, proj=proj, train=False)[1]
    fit(heads, lambda m, b, **kw: medusa_loss(m, b, proj=proj, **kw), seqs, [], OmegaConf.create(FIT), tmp_path)
    after = medusa_loss(heads, batch, proj=proj, train=False)[1]
    assert after["loss"] < before["loss"] - 0.5  # (the soft cross-entropy has the target entropy as its floor)
    assert after["top1_h0"] > before["top1_h0"]
    assert set(heads.state_dict()) == {f"{k}.0.linear.{w}" for k in range(2) for w in ("weight", "bias")}


def test_ranks_match_a_brute_force_count():
    target = tiny_llama(vocab=16, layers=1, seed=0, scale=10.0)
    seq = sequences(target, n=1)[0]
    heads = new_medusa_heads(target, num_heads=2)
    with torch.no_grad():
        for head in heads:
            head[0].linear.weight.normal_(0, 0.5)
    ranks = true_ranks(heads, target.lm_head, seq)
    want = target.lm_head(seq.features).argmax(-1)
    for row, t in enumerate(range(seq.start - 1, len(seq.tokens) - 2)):
        logits = heads(seq.features[t])
        for k in range(2):
            order = logits[k].argsort(descending=True).tolist()
            assert int(ranks[row, k]) == min(order.index(int(want[t + k + 1])), 10)
    stats = rank_statistics(heads, target, [seq])
    assert stats["anchors"] == len(ranks)
    assert abs(stats["per_head"]["h0"]["top1"] - float((ranks[:, 0] == 0).float().mean())) < 1e-9


def test_best_tree_and_its_expected_accepted_length():
    counts = Counter({(0,): 50, (1,): 20, (0, 0): 25, (0, 1): 5, (1, 0): 8, (0, 0, 0): 12})
    assert best_tree(counts, 3) == [[0], [1], [0, 0]]
    assert best_tree(counts, 4) == [[0], [1], [0, 0], [0, 0, 0]]
    assert abs(tree_accept_length(counts, 100, [[0], [1], [0, 0]]) - 0.95) < 1e-12
    assert tree_accept_length(counts, 100, [[2], [0, 3]]) == 0.0


def test_ranks_outside_the_draft_vocabulary_are_misses():
    target = tiny_llama(vocab=16, layers=1, seed=0, scale=10.0)
    seq = sequences(target, n=1)[0]
    heads = new_medusa_heads(target, num_heads=2)
    want = target.lm_head(seq.features).argmax(-1)
    t = seq.start - 1
    heads.draft_vocab = torch.tensor([v for v in range(16) if v != int(want[t + 1])])  # head 0's first target out
    ranks = true_ranks(heads, target.lm_head, seq)
    assert int(ranks[0, 0]) == 10
    kept = int(want[t + 2])
    if kept != int(want[t + 1]):
        logits = heads(seq.features[t])[1]
        assert int(ranks[0, 1]) == min(int((logits > logits[heads.draft_vocab.tolist().index(kept)]).sum()), 10)
