"""Rounds ended by the draft vocabulary (experiments/research/vocab_ends.py): each round's last emitted token, a
round cut by the token cap left out; an EAGLE-3 head's vocabulary from its d2t, an EAGLE head's from the first
draft_vocab_size tokens of its file; the table counts the rounds ending outside it and refuses rows decoded with
other weights."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from eagle2.heads.checkpoint import weights_fingerprint, write_token_ids
from experiments.research.vocab_ends import head_vocabulary, round_endings, vocab_end_table


def test_round_endings_take_each_rounds_last_token():
    assert round_endings([5, 6, 7, 8, 9], [2, 1, 2]) == [6, 7, 9]
    assert round_endings([5, 6, 7], [2, 3]) == [6]  # the last round cut by the cap: left out


def test_vocabularies_and_the_table(tmp_path):
    eagle3 = tmp_path / "e3"
    eagle3.mkdir()
    ids = torch.tensor([2, 5, 6, 9])
    save_file({"d2t": ids - torch.arange(4), "fc.weight": torch.zeros(1)}, str(eagle3 / "model.safetensors"))
    assert head_vocabulary(eagle3, {}) == {2, 5, 6, 9}
    eagle = tmp_path / "e"
    eagle.mkdir()
    save_file({"fc.weight": torch.zeros(1)}, str(eagle / "model.safetensors"))
    write_token_ids(torch.tensor([9, 2, 7, 1]), eagle / "draft_vocab.safetensors")
    assert head_vocabulary(eagle, {"draft_vocab_size": 2}) == {9, 2}
    assert head_vocabulary(eagle, {}) is None

    rows = pd.DataFrame([
        {"method": "eagle3", "weights": {"eagle3_head": weights_fingerprint(eagle3)}, "method_config": {},
         "output_ids": [2, 3, 5, 9], "accept_lengths": [2, 2], "new_tokens": 4, "target_forwards": 2},
        {"method": "eagle2", "weights": {"head": weights_fingerprint(eagle)}, "method_config": {"draft_vocab_size": 2},
         "output_ids": [9, 2, 7], "accept_lengths": [1, 1, 1], "new_tokens": 3, "target_forwards": 3},
        {"method": "plain", "weights": {}, "method_config": {}, "output_ids": [1], "accept_lengths": [1],
         "new_tokens": 1, "target_forwards": 1},
    ])
    table = vocab_end_table(rows, {"eagle3_head": eagle3, "head": eagle})
    assert "| eagle3 | eagle3_head | 1 | 2 | 2.00 | 0.500 | 0.250 |" in table  # round ending on 3: outside
    assert "| eagle2 | head | 1 | 3 | 1.00 | 0.333 | 0.333 |" in table  # 7 is past the first 2 tokens
    assert "plain" not in table
    write_token_ids(torch.tensor([9, 2, 7, 3]), eagle / "draft_vocab.safetensors")  # the head changed since
    with pytest.raises(SystemExit, match="other head weights"):
        vocab_end_table(rows, {"eagle3_head": eagle3, "head": eagle})
