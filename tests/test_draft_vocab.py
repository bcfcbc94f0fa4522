"""Draft vocabularies: the file stores int32 ids and reads back int64 (older int64 files read the same); extending a
head's vocabulary by a corpus (experiments/research/draft_vocab.py) keeps the head's order as a prefix, the corpus's
new ids following in its order; coverage counts the held-out tokens an id set holds."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eagle2.heads.checkpoint import read_token_ids, write_token_ids
from experiments.research.draft_vocab import coverage, extended


def test_token_ids_are_stored_int32_and_read_int64(tmp_path):
    ids = torch.tensor([49151, 0, 17, 2**31 - 1])
    write_token_ids(ids, tmp_path / "v.safetensors")
    with safe_open(str(tmp_path / "v.safetensors"), "pt") as f:
        assert f.get_slice("token_ids").get_dtype() == "I32"
    back = read_token_ids(tmp_path / "v.safetensors")
    assert back.dtype == torch.int64 and back.tolist() == ids.tolist()
    save_file({"token_ids": ids}, str(tmp_path / "old.safetensors"))  # the int64 files written before
    assert read_token_ids(tmp_path / "old.safetensors").tolist() == ids.tolist()
    with pytest.raises(ValueError, match="does not fit"):
        write_token_ids(torch.tensor([2**31]), tmp_path / "big.safetensors")


def test_extension_keeps_the_head_order_and_appends_new_ids():
    head, corpus = torch.tensor([5, 2, 9]), torch.tensor([2, 7, 5, 1])
    assert extended(head, corpus).tolist() == [5, 2, 9, 7, 1]


def test_coverage_counts_held_out_tokens():
    counts = torch.tensor([0.0, 4.0, 3.0, 2.0, 1.0], dtype=torch.float64)  # id -> occurrences in the held-out answers
    assert abs(coverage(torch.tensor([1, 2]), counts) - 0.7) < 1e-12
    assert abs(coverage(torch.tensor([4, 99]), counts) - 0.1) < 1e-12  # ids past the counted range hold nothing
