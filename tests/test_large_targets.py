"""What makes 70B targets load on one GPU machine, checked on tiny models: weights placed by
``from_pretrained(device_map=...)`` as they are read (no trip through host RAM on a GPU), and heads that
reuse the target's embedding instead of holding a private copy of it (2 GB at Llama-3-70B)."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from eagle2.bench.models import device_map, load_target
from eagle2.heads.eagle_head import load_head
from tests.test_head_format import HEADS, INTER, VOCAB, H, published_weights, write_checkpoint
from tests.zoo_fixtures import write_target


def model_cfg(path, **extra):
    return OmegaConf.create({"name": "tiny", "source": "hub", "hub_id": "none", "path": str(path), "dtype": "float32",
                             "device": "cpu", "attn_implementation": "sdpa", "kernels": "stock", **extra})


def test_device_map_streams_to_a_gpu_and_leaves_cpu_loading_as_it_was():
    assert device_map(model_cfg("x"), "cpu") is None  # CPU: load, then .to(device), as before
    assert device_map(model_cfg("x"), "cuda:1") == "cuda:1"  # GPU: shards go straight to the device
    assert device_map(model_cfg("x", device_map="auto"), "cuda") == "auto"


def test_device_map_auto_loads_the_same_model(tmp_path):
    from transformers import LlamaConfig

    folder = write_target(tmp_path / "t", LlamaConfig(vocab_size=32000, hidden_size=32, intermediate_size=64,
                                                      num_hidden_layers=2, num_attention_heads=4))
    plain, _ = load_target(model_cfg(folder))
    mapped, _ = load_target(model_cfg(folder, device_map="auto"))  # accelerate: every weight on the CPU here
    ids = torch.tensor([[1, 5, 9, 300]])
    assert torch.equal(plain(input_ids=ids).logits, mapped(input_ids=ids).logits)


def test_head_reuses_the_targets_embedding_when_its_copy_is_equal(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    target = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=H, intermediate_size=INTER,
                                          num_hidden_layers=2, num_attention_heads=HEADS,
                                          tie_word_embeddings=False)).half().eval()
    weights = published_weights(embed=True)
    weights["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().float()  # the authors' copy
    head = load_head(write_checkpoint(tmp_path / "same", weights, "bin"), target)
    assert head.embed_tokens is target.get_input_embeddings()  # no private copy
    weights["embed_tokens.weight"][3, 0] += 1.0  # one entry differs: the head keeps its own copy
    own = load_head(write_checkpoint(tmp_path / "other", weights, "bin"), target)
    assert own.embed_tokens is not target.get_input_embeddings()
    assert torch.equal(own.embed_tokens.weight, weights["embed_tokens.weight"].half())
