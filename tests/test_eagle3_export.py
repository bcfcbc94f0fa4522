"""An exported EAGLE-3 head holds what the serving engines and the authors' code read, by the facts of their
loaders (read 2026-12-04):

- vLLM ``vllm/model_executor/models/llama_eagle3.py`` (``Eagle3LlamaForCausalLM``; its registry maps the
  architecture ``LlamaForCausalLMEagle3`` to it): ``draft_vocab_size`` (defaults to ``vocab_size``), ``fc``
  input ``3 * (target_hidden_size or hidden_size)``, ``eagle_config.use_aux_hidden_state`` (default true),
  ``norm_before_residual`` (default false), ``attention_bias``; ``load_weights`` skips ``t2d``, renames
  ``d2t`` -> ``draft_id_to_target_id``, ``midlayer.`` -> ``layers.0.``, prefixes ``model.`` to every name
  but ``lm_head``, stacks ``q/k/v_proj`` into ``qkv_proj`` (input ``2 * hidden_size``) and ``gate/up_proj``
  into ``gate_up_proj``; ``embed_tokens`` optional; ``lm_head`` has ``draft_vocab_size`` rows; the fused
  layers from a top-level ``eagle_aux_hidden_state_layer_ids`` (the layers whose inputs are fused) else
  the default (2, L//2, L-3) (``gpu_model_runner``).
- SGLang ``python/sglang/srt/models/llama_eagle3.py`` (``EntryClass = [LlamaForCausalLMEagle3]``): params
  ``model.fc`` (bias only if ``config.bias``), ``model.midlayer.{self_attn.qkv_proj (2h input), mlp,
  input_layernorm, hidden_norm, post_attention_layernorm}``, ``model.norm``, ``lm_head`` (``draft_vocab_size``
  rows, **the embedding instead when ``tie_word_embeddings``**); a checkpoint name maps to itself or
  ``model.`` + itself, unknown names are silently skipped; ``d2t`` -> ``hot_token_id = d2t + arange``,
  ``t2d`` skipped; explicit fused layers (``eagle_config.eagle_aux_hidden_state_layer_ids``) are the layers
  whose outputs are fused (it captures at ``id + 1``).
- The authors, SafeAILab/EAGLE ``eagle/traineagle3/cnets.py`` and ``config.json``: ``fc`` Linear(3h, h, no
  bias), ``midlayer`` (hidden_norm, input_layernorm, post_attention_layernorm, self_attn, mlp), ``norm``,
  ``lm_head`` Linear(h, draft_vocab_size), buffers ``d2t`` (draft id -> target id minus draft id, sorted
  ids) and ``t2d`` (bool over the target vocabulary); config ``num_hidden_layers: 1``, ``draft_vocab_size``.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from eagle2.heads.eagle3_head import load_eagle3_head, save_eagle3_head
from tests.conftest import tiny_eagle3_head, tiny_llama

H, VOCAB, DRAFT, LAYERS = 32, 64, 40, 6


@pytest.fixture(scope="module")
def target():
    model = tiny_llama(vocab=VOCAB, layers=LAYERS, hidden=H)
    model.config.tie_word_embeddings = True  # as SmolLM2's: the export must still say false
    return model


def expected_tensors(cfg: dict) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
    """Name -> (shape, dtype or None for any float) of every tensor the three loaders above read."""
    h, inter, vocab, draft = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["draft_vocab_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    fc_in = 3 * (cfg.get("target_hidden_size") or h)
    return {
        "fc.weight": ((h, fc_in), None),
        "midlayer.self_attn.q_proj.weight": ((q, 2 * h), None),
        "midlayer.self_attn.k_proj.weight": ((kv, 2 * h), None),
        "midlayer.self_attn.v_proj.weight": ((kv, 2 * h), None),
        "midlayer.self_attn.o_proj.weight": ((h, q), None),
        "midlayer.mlp.gate_proj.weight": ((inter, h), None),
        "midlayer.mlp.up_proj.weight": ((inter, h), None),
        "midlayer.mlp.down_proj.weight": ((h, inter), None),
        "midlayer.input_layernorm.weight": ((h,), None),
        "midlayer.hidden_norm.weight": ((h,), None),
        "midlayer.post_attention_layernorm.weight": ((h,), None),
        "norm.weight": ((h,), None),
        "lm_head.weight": ((draft, h), None),
        "d2t": ((draft,), torch.int64),
        "t2d": ((vocab,), torch.bool),
    }


def vllm_names(names) -> set[str]:
    """The vLLM parameter each checkpoint name loads into (``Eagle3LlamaForCausalLM.load_weights`` and
    ``LlamaModel.load_weights``, stacked projections merged)."""
    out = set()
    for name in names:
        if "t2d" in name:
            continue
        if "d2t" in name:
            out.add("draft_id_to_target_id")
            continue
        name = name if "lm_head" in name else "model." + name
        name = name.replace("midlayer.", "layers.0.")
        for part, stacked in ((".q_proj", ".qkv_proj"), (".k_proj", ".qkv_proj"), (".v_proj", ".qkv_proj"),
                              (".gate_proj", ".gate_up_proj"), (".up_proj", ".gate_up_proj")):
            name = name.replace(part, stacked)
        out.add(name)
    return out


VLLM_PARAMS = {"model.fc.weight", "model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.self_attn.o_proj.weight",
               "model.layers.0.mlp.gate_up_proj.weight", "model.layers.0.mlp.down_proj.weight",
               "model.layers.0.input_layernorm.weight", "model.layers.0.hidden_norm.weight",
               "model.layers.0.post_attention_layernorm.weight", "model.norm.weight", "lm_head.weight",
               "draft_id_to_target_id"}  # (model.embed_tokens.weight skipped when the checkpoint has none)
SGLANG_PARAMS = {"model.fc.weight", "model.midlayer.self_attn.qkv_proj.weight",
                 "model.midlayer.self_attn.o_proj.weight", "model.midlayer.mlp.gate_up_proj.weight",
                 "model.midlayer.mlp.down_proj.weight", "model.midlayer.input_layernorm.weight",
                 "model.midlayer.hidden_norm.weight", "model.midlayer.post_attention_layernorm.weight",
                 "model.norm.weight", "lm_head.weight"}  # (+ model.embed_tokens.weight, from the target)


def sglang_names(names, tied: bool) -> set[str]:
    """The SGLang parameter each checkpoint name loads into (unknown names skipped silently, as it does)."""
    params = SGLANG_PARAMS - ({"lm_head.weight"} if tied else set())  # tied: lm_head IS the embedding
    out = set()
    for name in names:
        if "d2t" in name or "t2d" in name:
            continue
        for part, stacked in ((".q_proj", ".qkv_proj"), (".k_proj", ".qkv_proj"), (".v_proj", ".qkv_proj"),
                              (".gate_proj", ".gate_up_proj"), (".up_proj", ".gate_up_proj")):
            name = name.replace(part, stacked)
        name = name if name in params else "model." + name
        if name in params:
            out.add(name)
    return out


@pytest.mark.parametrize("layers", ["default", "custom"])
def test_export_holds_what_vllm_sglang_and_the_authors_read(target, tmp_path, layers):
    head = tiny_eagle3_head(target, seed=3, draft_vocab_size=DRAFT)
    if layers == "custom":
        head.feature_layers = (1, 3, 4)
    folder = save_eagle3_head(head, tmp_path / "h", dtype=torch.bfloat16)
    cfg = json.loads((folder / "config.json").read_text())
    state = load_file(str(folder / "model.safetensors"))

    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["draft_vocab_size"] == DRAFT and cfg["vocab_size"] == VOCAB and cfg["num_hidden_layers"] == 1
    assert cfg["tie_word_embeddings"] is False and not cfg.get("bias", False) and not cfg.get("attention_bias")
    assert not cfg.get("norm_before_residual", False) and cfg["eagle_config"]["use_aux_hidden_state"] is True
    assert cfg["rope_theta"] == target.config.rope_parameters["rope_theta"] and cfg["torch_dtype"] == "bfloat16"
    if layers == "default":  # every reader assumes (2, L//2, L-3): nothing written
        assert "eagle_aux_hidden_state_layer_ids" not in cfg
        assert "eagle_aux_hidden_state_layer_ids" not in cfg["eagle_config"]
    else:  # vLLM: the layers whose inputs are fused; SGLang: whose outputs are
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 3]

    expected = expected_tensors(cfg)
    assert set(state) == set(expected)
    for name, (shape, dtype) in expected.items():
        assert tuple(state[name].shape) == shape, name
        assert state[name].dtype == dtype if dtype else state[name].dtype.is_floating_point, name
    assert vllm_names(state) == VLLM_PARAMS
    assert sglang_names(state, cfg["tie_word_embeddings"]) == SGLANG_PARAMS
    hot = state["d2t"] + torch.arange(DRAFT)  # SGLang's hot_token_id, vLLM's draft id -> target id
    assert torch.equal(hot, head.draft_token_ids()) and bool((hot[1:] > hot[:-1]).all())
    assert torch.equal(state["t2d"].nonzero()[:, 0], hot)

    loaded = load_eagle3_head(folder, target)  # our loader reads it back, layers included
    assert loaded.feature_layers == head.feature_layers
    for key, value in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key].float(), value.to(torch.bfloat16).float())
