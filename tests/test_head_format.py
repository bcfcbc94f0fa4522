"""The published EAGLE head checkpoint format: synthetic checkpoints written exactly as the authors'
(``config.json`` without ``rope_theta``, optional ``"bias"``; ``model.safetensors`` or
``pytorch_model.bin``; optional ``embed_tokens.weight``) load weight for weight, bad ones fail naming
the key, and ``save_head`` -> ``load_head`` is lossless."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from eagle2.heads.checkpoint import WeightFileError
from eagle2.heads.eagle_head import causal_mask, load_head, save_head

H, INTER, VOCAB, HEADS = 32, 64, 64, 4


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=H, intermediate_size=INTER, num_hidden_layers=2,
                      num_attention_heads=HEADS, max_position_embeddings=128, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def published_config(bias: bool | None = True) -> dict:
    """A config.json as the authors publish it: LlamaConfig fields, one layer, no rope_theta."""
    cfg = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
           "hidden_size": H, "initializer_range": 0.02, "intermediate_size": INTER,
           "max_position_embeddings": 128, "model_type": "llama", "num_attention_heads": HEADS,
           "num_hidden_layers": 1, "pad_token_id": 0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
           "torch_dtype": "float16", "transformers_version": "4.28.1", "use_cache": True, "vocab_size": VOCAB}
    if bias is not None:
        cfg["bias"] = bias
    return cfg


def published_weights(bias: bool = True, embed: bool = False, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g) * 0.05

    w = {"fc.weight": rnd(H, 2 * H)}
    if bias:
        w["fc.bias"] = rnd(H)
    for name in ("q", "k", "v", "o"):
        w[f"layers.0.self_attn.{name}_proj.weight"] = rnd(H, H)
    w["layers.0.mlp.gate_proj.weight"] = rnd(INTER, H)
    w["layers.0.mlp.up_proj.weight"] = rnd(INTER, H)
    w["layers.0.mlp.down_proj.weight"] = rnd(H, INTER)
    w["layers.0.post_attention_layernorm.weight"] = 1 + rnd(H)
    if embed:
        w["embed_tokens.weight"] = rnd(VOCAB, H)
    return w


def write_checkpoint(folder, weights, fmt: str, bias: bool | None = True):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(published_config(bias), indent=2))
    if fmt == "safetensors":
        save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    else:
        torch.save(weights, folder / "pytorch_model.bin")
    return folder


def run_head(head, seed: int = 2):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (2, 7), generator=g)
    feats = torch.randn(2, 7, H, generator=g)
    with torch.no_grad():
        return head(ids, feats, position_ids=torch.arange(7).expand(2, -1),
                    attention_mask=causal_mask(7, 0, torch.float32))


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("embed", [False, True])
def test_every_published_weight_lands(target, tmp_path, fmt, embed):
    weights = published_weights(embed=embed)
    head = load_head(write_checkpoint(tmp_path / "ckpt", weights, fmt), target)
    state = head.state_dict()
    for key, value in weights.items():
        if key == "embed_tokens.weight":
            assert torch.equal(head.embed_tokens.weight, value)
        else:
            assert torch.equal(state[key], value), key
    if not embed:
        assert head.embed_tokens is target.get_input_embeddings()
    assert head.config.num_hidden_layers == 1 and head.bias
    assert head.config.rope_parameters["rope_theta"] == 10000.0  # the authors' default when absent
    assert isinstance(head.layers[0].input_layernorm, torch.nn.Identity)
    assert not head.training


def test_bias_false_and_absent(target, tmp_path):
    head = load_head(write_checkpoint(tmp_path / "nobias", published_weights(bias=False), "bin", bias=False), target)
    assert head.fc.bias is None and not head.bias
    head = load_head(write_checkpoint(tmp_path / "default", published_weights(), "safetensors", bias=None), target)
    assert head.bias and head.fc.bias is not None


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_missing_key_is_named(target, tmp_path, fmt):
    weights = published_weights()
    del weights["layers.0.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match="layers.0.mlp.up_proj.weight"):
        load_head(write_checkpoint(tmp_path / "ckpt", weights, fmt), target)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_wrong_shape_is_named(target, tmp_path, fmt):
    weights = published_weights()
    weights["fc.weight"] = torch.zeros(H, H)
    with pytest.raises(ValueError, match=r"fc\.weight.*\(32, 32\)"):
        load_head(write_checkpoint(tmp_path / "ckpt", weights, fmt), target)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_extra_key_is_named(target, tmp_path, fmt):
    weights = published_weights()
    weights["layers.0.input_layernorm.weight"] = torch.ones(H)
    with pytest.raises(KeyError, match="layers.0.input_layernorm.weight"):
        load_head(write_checkpoint(tmp_path / "ckpt", weights, fmt), target)


def test_bias_key_without_bias_config_is_an_extra_key(target, tmp_path):
    with pytest.raises(KeyError, match="fc.bias"):
        load_head(write_checkpoint(tmp_path / "ckpt", published_weights(bias=True), "bin", bias=False), target)


def test_pickled_code_is_refused(target, tmp_path):
    class Payload:
        def __reduce__(self):
            return (print, ("pickled code ran",))

    folder = write_checkpoint(tmp_path / "ckpt", published_weights(), "bin")
    torch.save({**published_weights(), "fc.weight": Payload()}, folder / "pytorch_model.bin")
    refused = f"refused: {folder}/pytorch_model.bin is a pickle, which can run code"
    with pytest.raises(WeightFileError, match=refused) as err:
        load_head(folder, target)
    assert "(it calls print)" in str(err.value) and "weights_only" not in str(err.value)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_save_load_round_trip_is_exact(target, tmp_path, fmt):
    original = load_head(write_checkpoint(tmp_path / "ckpt", published_weights(), fmt), target)
    saved = save_head(original, tmp_path / "saved")
    assert not (saved / "pytorch_model.bin").exists()
    reloaded = load_head(saved, target)
    assert torch.equal(run_head(original), run_head(reloaded))
    for (k, a), b in zip(original.state_dict().items(), reloaded.state_dict().values()):
        assert torch.equal(a, b), k
    assert reloaded.embed_tokens is target.get_input_embeddings()


def test_save_head_drops_a_checkpoints_own_embedding(target, tmp_path):
    own = load_head(write_checkpoint(tmp_path / "ckpt", published_weights(embed=True), "bin"), target)
    saved = save_head(own, tmp_path / "saved")
    from safetensors.torch import load_file

    assert "embed_tokens.weight" not in load_file(str(saved / "model.safetensors"))
    assert load_head(saved, target).embed_tokens is target.get_input_embeddings()


def test_trained_head_export_round_trip(target, tmp_path):
    from eagle2.training.objectives.eagle import new_head
    from eagle2.training.support.models import export_dtype

    head = new_head(target, init_from_target=True).eval()
    save_head(head, tmp_path / "fp32", dtype=export_dtype(head, 25))
    assert torch.equal(run_head(head), run_head(load_head(tmp_path / "fp32", target)))
    save_head(head, tmp_path / "fp16", dtype=torch.float16)
    assert torch.allclose(run_head(head), run_head(load_head(tmp_path / "fp16", target)), atol=2e-2)
    assert export_dtype(head, 1e-3) == torch.float16


def test_exports_store_the_configured_dtype_and_load_cast(target, tmp_path):
    """``train.export.dtype`` (bfloat16 by default) is what an export stores; loaded beside an fp32 target
    the head is fp32 again, close to the trained one, its rotary table fp32."""
    from omegaconf import OmegaConf
    from safetensors import safe_open

    from eagle2.training.objectives.eagle import new_head
    from eagle2.training.support.models import export_dtype

    head = new_head(target, init_from_target=True).eval()
    from pathlib import Path

    defaults = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "train" / "smollm2.yaml")
    assert defaults.export.dtype == defaults.medusa.export_dtype == "bfloat16"
    dtype = export_dtype(head, 25, defaults.export.dtype)
    assert dtype == torch.bfloat16 and export_dtype(head, 25, "float32") == torch.float32
    with pytest.raises(ValueError, match="export dtype 'bf16'"):
        export_dtype(head, 25, "bf16")
    folder = save_head(head, tmp_path / "bf16", dtype=dtype)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys() if not k.endswith("inv_freq")} == {torch.bfloat16}
    loaded = load_head(folder, target)
    assert next(loaded.parameters()).dtype == torch.float32
    assert all(b.dtype == torch.float32 for n, b in loaded.named_buffers() if n.endswith("inv_freq"))
    assert torch.allclose(run_head(head), run_head(loaded), atol=5e-2)


def test_half_precision_head_keeps_fp32_rotary_tables(target, tmp_path):
    """Loaded beside a bf16 target, the head's weights are bf16 but its rotary inv_freq stays fp32, as the
    target's own does: rounded, every rotary angle of the head would drift from the target's."""
    half = copy.deepcopy(target).to(torch.bfloat16)
    head = load_head(write_checkpoint(tmp_path / "ckpt", published_weights(), "safetensors"), half)
    assert next(head.parameters()).dtype == torch.bfloat16
    tables = [b for name, b in head.named_buffers() if name.endswith("inv_freq")]
    assert tables and all(b.dtype == torch.float32 for b in tables)
    fresh = load_head(write_checkpoint(tmp_path / "ref", published_weights(), "safetensors"), target)
    assert torch.equal(tables[0], dict(fresh.named_buffers())["rotary_emb.inv_freq"])
