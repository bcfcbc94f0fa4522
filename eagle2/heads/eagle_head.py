"""The EAGLE-1/EAGLE-2 feature-level draft head, and its published checkpoint format.

Wiring (as in the authors' heads): the input at position i is ``fc(concat(embed(t[i+1]), f[i]))``,
embedding first, where ``f[i]`` is the target's last hidden state AFTER its final norm (the tensor its
LM head multiplies). Then one Llama decoder layer whose input layernorm is absent, and no final norm:
the output is a predicted feature that goes straight into the target's LM head. Extra layers (an
extension, ``num_hidden_layers > 1``) keep their input layernorm.

Checkpoint format (a folder, local or a hub id): ``config.json`` = a LlamaConfig with
``num_hidden_layers = 1`` and an optional ``"bias"`` (for ``fc``, default true); weights in
``model.safetensors`` or ``pytorch_model.bin`` with keys ``fc.weight`` [h, 2h], ``fc.bias`` [h],
``layers.0.self_attn.{q,k,v,o}_proj.weight``, ``layers.0.mlp.{gate,up,down}_proj.weight``,
``layers.0.post_attention_layernorm.weight`` and optionally ``embed_tokens.weight`` (the target's
embedding is used when absent). Loading is strict, never runs pickled code, and names a bad key. The
authors' published EAGLE-1/2 heads load as they are: fp16 ``pytorch_model.bin`` with
``embed_tokens.weight``, a ``config.json`` without ``rope_theta`` (their code then uses 10000), without
``model_type`` or ``bias`` (true), and saved ``rotary_emb.inv_freq`` buffers (dropped with a note).
Our one extension is optional: ``draft_vocab.safetensors`` (``token_ids``: the target's tokens ordered
by frequency in the head's training answers), for drafting over a reduced vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from eagle2.core.cache import cache_kwargs
from eagle2.core.tree import additive_mask
from eagle2.heads.checkpoint import (
    WEIGHT_FILES,
    cast_like_target,
    check_state,
    checkpoint_folder,
    drop_rotary_buffers,
    read_token_ids,
    read_weights,
    shared_or_own_embedding,
    write_checkpoint,
    write_token_ids,
)
from eagle2.heads.family import Family

DRAFT_VOCAB_FILE = "draft_vocab.safetensors"  # our extension: token ids by frequency, for reduced drafting


class ReadsTargetEmbedding(nn.Module):
    """A head whose input embedding is the target's (``attach_embedding``), kept out of its state dict."""

    _embed: tuple[nn.Module, ...] = ()  # set per instance by attach_embedding

    def attach_embedding(self, embed_tokens: nn.Module):
        self._embed = (embed_tokens,)
        return self

    @property
    def embed_tokens(self) -> nn.Module:
        if not self._embed:
            raise RuntimeError(f"{type(self).__name__} has no token embedding: call attach_embedding(target embedding)")
        return self._embed[0]


class EagleHead(ReadsTargetEmbedding):
    def __init__(self, config: LlamaConfig, bias: bool = True):
        super().__init__()
        self.config = config
        self.bias = bias
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=bias)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.layers[0].input_layernorm = nn.Identity()  # absent in the published heads
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.draft_vocab: torch.Tensor | None = None  # token ids by training frequency (optional)

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, *, position_ids: torch.Tensor,
                attention_mask: torch.Tensor, cache=None) -> torch.Tensor:
        """input_ids (B, Q) tokens t[i+1]; features (B, Q, H) f[i]; attention_mask additive float
        (B, 1, Q, past+Q). Returns predicted features (B, Q, H)."""
        emb = self.embed_tokens(input_ids).to(features.dtype)
        hidden = self.fc(torch.cat([emb, features], dim=-1))
        pos_emb = self.rotary_emb(hidden, position_ids=position_ids)
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=attention_mask, position_ids=position_ids,
                           position_embeddings=pos_emb, use_cache=cache is not None,
                           **cache_kwargs(layer, cache))
        return hidden


def causal_mask(q_len: int, past: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """Additive (1, 1, q_len, past + q_len) mask: query i sees keys 0..past+i."""
    k = torch.arange(past + q_len, device=device)
    q = torch.arange(q_len, device=device)[:, None] + past
    return additive_mask(k[None, :] <= q, dtype, device)


def head_config_from_target(target_config, num_layers: int = 1) -> LlamaConfig:
    """A LlamaConfig for a head matching the target's width, heads and RoPE."""
    cfg = target_config.to_dict()
    for key in ("quantization_config", "architectures", "auto_map", "_name_or_path", "_model_name_or_path"):
        cfg.pop(key, None)
    cfg["num_hidden_layers"] = num_layers
    cfg["model_type"] = "llama"
    config = LlamaConfig(**cfg)
    config._attn_implementation = getattr(target_config, "_attn_implementation", None) or "sdpa"
    return config


def _read_config(folder: Path) -> tuple[LlamaConfig, bool]:
    raw = json.loads((folder / "config.json").read_text())
    bias = bool(raw.pop("bias", True))
    if "rope_theta" not in raw and not raw.get("rope_parameters") and not raw.get("rope_scaling"):
        raw["rope_theta"] = 10000.0  # the authors' code defaults to this (their configs say "rope_scaling": null)
    if "rope_scaling" in raw and raw["rope_scaling"] is None:
        del raw["rope_scaling"]  # null: no scaling
    raw.setdefault("model_type", "llama")
    return LlamaConfig(**raw), bias


def load_head(location: str | Path, target) -> EagleHead:
    """Load a head in the published format, strictly, on the target's device and dtype."""
    folder = checkpoint_folder(str(location), "EAGLE head", "model.head",
                               ("config.json", DRAFT_VOCAB_FILE, *WEIGHT_FILES))
    what = f"EAGLE head {folder}"
    config, bias = _read_config(folder)
    if config.hidden_size != target.config.hidden_size:
        raise ValueError(f"{what}: hidden_size {config.hidden_size} does not match the target's "
                         f"{target.config.hidden_size}")
    config._attn_implementation = getattr(target.config, "_attn_implementation", "sdpa")
    with torch.device("meta"):  # no random init (seconds at 7B width): every weight comes from the file
        head = EagleHead(config, bias=bias)
    state = read_weights(folder)
    drop_rotary_buffers(what, state)
    embed = state.pop("embed_tokens.weight", None)
    expected = head.state_dict()
    if embed is not None:
        check_state(what, {"embed_tokens.weight": embed},
                    {"embed_tokens.weight": torch.empty(config.vocab_size, config.hidden_size, device="meta")})
    check_state(what, state, expected)
    head.load_state_dict(state, assign=True)  # checked above: exactly the expected keys and shapes
    head.rotary_emb = LlamaRotaryEmbedding(config)  # computed from the config, never stored
    head.attach_embedding(shared_or_own_embedding(what, embed, target))
    del embed, state  # the file's copy gone before the head is cast (1 GB in fp16 at a 128k vocabulary)
    if (folder / DRAFT_VOCAB_FILE).is_file():
        head.draft_vocab = read_token_ids(folder / DRAFT_VOCAB_FILE)
    return cast_like_target(head, target).eval()


def save_head(head: EagleHead, folder: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (no embedding) in the published layout."""
    cfg = {**head.config.to_dict(), "bias": head.bias, "architectures": ["EagleHead"]}
    folder = write_checkpoint(folder, cfg, {k: v for k, v in head.state_dict().items() if "rotary" not in k}, dtype)
    if head.draft_vocab is not None:
        write_token_ids(head.draft_vocab, folder / DRAFT_VOCAB_FILE)
    return folder


FAMILY = Family("head", load_head, save_head, fixture="tests.zoo_fixtures:write_published_head",
                doc="EAGLE head (hub id or local folder) for method=eagle/eagle2")
