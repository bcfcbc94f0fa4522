"""Published drafter checkpoints load as they are: the EAGLE-1/2 heads' real variants (fp16
``pytorch_model.bin`` with ``embed_tokens.weight``, configs without ``rope_theta``, ``model_type`` or
``bias``, saved rotary ``inv_freq`` buffers) and SpS drafts as full causal-LM checkpoints (like
``double7/vicuna-68m``), while anything else missing, extra or mis-shaped is refused by name. A head
written like the authors' loads with ``model.head=DIR`` for SmolLM2 and decodes exactly as plain."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from eagle2.heads.draft_model import load_draft_model
from eagle2.heads.eagle_head import load_head
from eagle2.results.store import read_rows
from tests.conftest import tiny_llama
from tests.zoo_fixtures import published_head_weights, save_weights, write_full_draft, write_published_head

SMALL_DRAFT = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4}


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab=64, layers=2, hidden=32)


HEAD_VARIANTS = {  # name -> writer options: each a way the authors' heads really come
    "authors_7b": {},  # fp16 .bin, embed_tokens, no rope_theta, "rope_scaling": null, no "bias"
    "no_model_type": {"model_type": False},
    "inv_freq": {"inv_freq": True},
    "no_embed_safetensors": {"embed": False, "fmt": "safetensors"},
    "llama3_style": {"rope_theta": True, "bias": False},  # rope_theta given, "bias": false
    "fp32": {"dtype": torch.float32},
}


@pytest.mark.parametrize("variant", list(HEAD_VARIANTS))
def test_published_head_variants_load_weight_for_weight(target, tmp_path, variant, caplog):
    options = HEAD_VARIANTS[variant]
    folder = write_published_head(tmp_path / "head", target.config, **options)
    with caplog.at_level(logging.INFO, logger="eagle2.heads.checkpoint"):
        head = load_head(folder, target)
    written = torch.load(folder / "pytorch_model.bin", weights_only=True) if options.get("fmt") != "safetensors" \
        else __import__("safetensors.torch", fromlist=["load_file"]).load_file(str(folder / "model.safetensors"))
    state = head.state_dict()
    for key, value in written.items():
        if key.endswith("inv_freq"):
            continue
        loaded = head.embed_tokens.weight if key == "embed_tokens.weight" else state[key]
        assert torch.equal(loaded, value.float()), key
    assert head.fc.bias is None if options.get("bias") is False else head.fc.bias is not None
    theta = head.config.rope_parameters["rope_theta"]
    assert theta == (target.config.rope_parameters["rope_theta"] if options.get("rope_theta") else 10000.0)
    assert ("rotary buffer" in caplog.text) == bool(options.get("inv_freq"))
    assert head.embed_tokens is not target.get_input_embeddings() if options.get("embed", True) \
        else head.embed_tokens is target.get_input_embeddings()


def _write_head_state(folder: Path, target, change) -> Path:
    write_published_head(folder, target.config)
    weights = published_head_weights(target.config)
    change(weights)
    save_weights(folder, weights, "bin")
    return folder


BAD_HEADS = {  # name -> (change to the published weights, the error's type and the name it must say)
    "missing": (lambda w: w.pop("layers.0.mlp.up_proj.weight"), KeyError, "layers.0.mlp.up_proj.weight"),
    "extra": (lambda w: w.update({"layers.0.input_layernorm.weight": torch.ones(32)}), KeyError,
              "layers.0.input_layernorm.weight"),
    "extra_lm_head": (lambda w: w.update({"lm_head.weight": torch.ones(64, 32)}), KeyError, "lm_head.weight"),
    "misshaped": (lambda w: w.update({"fc.weight": torch.zeros(32, 32)}), ValueError, r"fc\.weight.*\(32, 32\)"),
    "misshaped_embed": (lambda w: w.update({"embed_tokens.weight": torch.zeros(63, 32)}), ValueError,
                        r"embed_tokens\.weight.*\(63, 32\)"),
    "other_buffer": (lambda w: w.update({"layers.0.self_attn.rotary_emb.cos_cached": torch.ones(4)}), KeyError,
                     "rotary_emb.cos_cached"),
}


@pytest.mark.parametrize("bad", list(BAD_HEADS))
def test_bad_heads_are_refused_by_name(target, tmp_path, bad):
    change, error, name = BAD_HEADS[bad]
    with pytest.raises(error, match=name):
        load_head(_write_head_state(tmp_path / "head", target, change), target)


def test_head_of_another_width_is_refused(target, tmp_path):
    other = tiny_llama(vocab=64, layers=1, hidden=48)
    with pytest.raises(ValueError, match="hidden_size 48"):
        load_head(write_published_head(tmp_path / "head", other.config), target)


DRAFT_VARIANTS = {"fp32_bin": {}, "fp16_bin": {"dtype": torch.float16}, "inv_freq": {"inv_freq": True},
                  "safetensors": {"fmt": "safetensors"}}


@pytest.mark.parametrize("variant", list(DRAFT_VARIANTS))
def test_full_checkpoint_sps_draft_variants_load_weight_for_weight(target, tmp_path, variant):
    folder = write_full_draft(tmp_path / "draft", target.config, shape=SMALL_DRAFT, **DRAFT_VARIANTS[variant])
    draft = load_draft_model(folder, target)
    state = draft.state_dict()
    written = (torch.load(folder / "pytorch_model.bin", weights_only=True) if variant != "safetensors" else
               __import__("safetensors.torch", fromlist=["load_file"]).load_file(str(folder / "model.safetensors")))
    assert {k for k in written if "inv_freq" not in k} == set(state)
    for key, value in state.items():
        assert torch.equal(value, written[key].float()), key
    assert draft.model.embed_tokens is not target.get_input_embeddings()


BAD_DRAFTS = {
    "missing": (lambda w: w.pop("model.layers.1.mlp.down_proj.weight"), KeyError, "model.layers.1.mlp.down_proj"),
    "missing_lm_head": (lambda w: w.pop("lm_head.weight"), KeyError, "lm_head.weight"),
    "extra": (lambda w: w.update({"model.layers.2.input_layernorm.weight": torch.ones(32)}), KeyError,
              "model.layers.2.input_layernorm.weight"),
    "misshaped": (lambda w: w.update({"model.norm.weight": torch.ones(31)}), ValueError, r"model\.norm\.weight.*31"),
}


@pytest.mark.parametrize("bad", list(BAD_DRAFTS))
def test_bad_sps_drafts_are_refused_by_name(target, tmp_path, bad):
    change, error, name = BAD_DRAFTS[bad]
    folder = write_full_draft(tmp_path / "draft", target.config, shape=SMALL_DRAFT)
    weights = torch.load(folder / "pytorch_model.bin", weights_only=True)
    change(weights)
    save_weights(folder, weights, "bin")
    with pytest.raises(error, match=name):
        load_draft_model(folder, target)


def test_tied_draft_without_lm_head_loads(target, tmp_path):
    folder = write_full_draft(tmp_path / "draft", target.config, shape=SMALL_DRAFT)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    weights = torch.load(folder / "pytorch_model.bin", weights_only=True)
    del weights["lm_head.weight"]
    save_weights(folder, weights, "bin")
    draft = load_draft_model(folder, target)
    assert torch.equal(draft.lm_head.weight, weights["model.embed_tokens.weight"])


def test_authors_head_decodes_like_plain_on_smollm2(tmp_path, smollm2, shared_target_loads):
    """The issue's acceptance check: a random head written like the published EAGLE-1/2 heads (fp16
    ``pytorch_model.bin`` with ``embed_tokens.weight``, config without ``rope_theta``) loads with
    ``model.head=DIR`` for SmolLM2 and EAGLE-2 decodes token-identically to plain in fp32 (the static
    tree with such heads: tests/test_zoo.py)."""
    from eagle2.bench.runner import run
    from tests.test_runner import config

    head = write_published_head(tmp_path / "head", smollm2[0].config, rope_theta=False)  # as for Vicuna
    assert "rope_theta" not in json.loads((head / "config.json").read_text())
    common = ["dataset=gsm8k", "dataset.limit=1", "max_new_tokens=10", f"paths.results={tmp_path / 'r'}",
              f"model.head={head}", "model.dtype=float32", "threads=1"]
    for method in ("plain", "eagle2"):
        extra = ["method.total_tokens=8"] if method == "eagle2" else []
        run(config(f"method={method}", *common, *extra))
    outputs = {r["method"]: r["output_ids"] for r in
               (row for path in (tmp_path / "r").rglob("*.jsonl") for row in read_rows(path)) if r["status"] == "ok"}
    assert set(outputs) == {"plain", "eagle2"} and outputs["eagle2"] == outputs["plain"]
