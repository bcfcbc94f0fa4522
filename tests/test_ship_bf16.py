"""experiments/ship_bf16.py on a copy: floating tensors become bf16 but rotary ``inv_freq`` (fp32) and integer
draft vocabularies; file metadata kept; config.json's dtype marked. The shipped artifacts are never touched."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from experiments.ship_bf16 import ship


def test_ship_bf16_rewrites_a_copy(tmp_path):
    folder = tmp_path / "eagle_head"
    folder.mkdir()
    tensors = {"fc.weight": torch.randn(4, 8), "rotary_emb.inv_freq": torch.rand(4),
               "layers.0.norm.weight": torch.rand(8, dtype=torch.float16)}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt", "note": "kept"})
    save_file({"ids": torch.arange(5)}, str(folder / "draft_vocab.safetensors"))
    (folder / "config.json").write_text(json.dumps({"hidden_size": 8, "dtype": "float32"}))
    ship(tmp_path, ["eagle_head"])
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        assert f.metadata() == {"format": "pt", "note": "kept"}
        got = {k: f.get_tensor(k) for k in f.keys()}
    assert got["fc.weight"].dtype == torch.bfloat16 and got["layers.0.norm.weight"].dtype == torch.bfloat16
    assert torch.equal(got["fc.weight"], tensors["fc.weight"].to(torch.bfloat16))
    assert torch.equal(got["rotary_emb.inv_freq"], tensors["rotary_emb.inv_freq"])  # fp32, unrounded
    with safe_open(str(folder / "draft_vocab.safetensors"), framework="pt") as f:
        assert torch.equal(f.get_tensor("ids"), torch.arange(5))
    assert json.loads((folder / "config.json").read_text()) == {"hidden_size": 8, "dtype": "bfloat16"}
    with pytest.raises(FileNotFoundError, match="no such drafter folder"):
        ship(tmp_path, ["sps_draft"])
