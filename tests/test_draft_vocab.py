"""Extending a head's draft vocabulary by a corpus (experiments/research/draft_vocab.py): the head's order stays a
prefix, the corpus's new ids follow in its order, and coverage counts the held-out tokens an id set holds."""

from __future__ import annotations

import torch

from experiments.research.draft_vocab import coverage, extended


def test_extension_keeps_the_head_order_and_appends_new_ids():
    head, corpus = torch.tensor([5, 2, 9]), torch.tensor([2, 7, 5, 1])
    assert extended(head, corpus).tolist() == [5, 2, 9, 7, 1]


def test_coverage_counts_held_out_tokens():
    counts = torch.tensor([0.0, 4.0, 3.0, 2.0, 1.0], dtype=torch.float64)  # id -> occurrences in the held-out answers
    assert abs(coverage(torch.tensor([1, 2]), counts) - 0.7) < 1e-12
    assert abs(coverage(torch.tensor([4, 99]), counts) - 0.1) < 1e-12  # ids past the counted range hold nothing
