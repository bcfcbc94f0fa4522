"""The DFlash draft model (Chen, Liang, Liu, arXiv 2602.06036; z-lab's DFlash), and its format.

A block-diffusion drafter: a block of ``block_size`` tokens, the anchor (the last committed token) followed by
``block_size`` - 1 mask tokens, goes through a few decoder layers in ONE forward, and the output at slot k is the
draft distribution of the token k places after the anchor (the same slot, no shift: one denoising step). The
target conditions every layer through its keys and values: the tapped target features of the context (the inputs
of target layers ``feature_layers``, by default EAGLE-3's 2, L//2, L-3, ``eagle2.core.features``) are fused once
(``hidden_norm(fc(concat))``) and each layer projects them with its own ``k_proj``/``v_proj`` into extra key/value
positions in front of the block's own; the context sends no query. The block attends bidirectionally within itself
and to every context position (the anchor's own feature is not known yet: the context ends just before it).
Attention is Qwen3-style (an RMSNorm over each query and key head, ``q_norm``/``k_norm``), the MLP Llama's. The
target's embedding reads the block and the target's LM head reads the outputs after the draft's ``norm``; neither
is stored with the draft.

Checkpoint format (z-lab's, as SGLang and vLLM read it): ``config.json`` with ``architectures:
["DFlashDraftModel"]``, the decoder's shapes (``hidden_size``, heads, ``head_dim``, ``num_hidden_layers``: the
draft's layers), ``num_target_layers``, ``block_size`` and ``dflash_config: {block_size, mask_token_id,
target_layer_ids}`` where ``target_layer_ids`` are the layers whose OUTPUTS are fused (one less than the inputs
this project taps); weights ``fc.weight`` [h, k*H], ``hidden_norm.weight``, ``norm.weight`` and per layer
``layers.{i}.self_attn.{q,k,v,o}_proj.weight``, ``layers.{i}.self_attn.{q,k}_norm.weight`` [head_dim],
``layers.{i}.mlp.{gate,up,down}_proj.weight``, ``layers.{i}.{input,post_attention}_layernorm.weight``. Loading is
strict and names a bad key.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half

from eagle2.core.features import eagle3_layers
from eagle2.heads.checkpoint import cast_like_target, check_state, checkpoint_folder, read_weights, write_checkpoint
from eagle2.heads.family import Family

ARCHITECTURE = "DFlashDraftModel"


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE of ``x`` (B, heads, N, d) at the last N of the positions of ``cos``/``sin`` (B, >= N, d)."""
    n = x.shape[-2]
    cos, sin = cos[:, None, -n:], sin[:, None, -n:]
    return x * cos + rotate_half(x) * sin


class DFlashAttention(nn.Module):
    """The block's queries against [context; block] keys and values, the context's projected by this layer."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        h, bias = config.hidden_size, bool(getattr(config, "attention_bias", False))
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or h // self.heads
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=bias)
        self.q_norm = LlamaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = LlamaRMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, x, context, position_embeddings, attention_mask, cache, layer: int) -> torch.Tensor:
        """x (B, Q, h) the block, context (B, C, h) the fused features; attention_mask additive (B, 1, Q,
        past + C + Q) or None (every entry visible); ``cache``: the context's and block's entries go behind the
        past ones (``cache.update``)."""
        b, q_len, _ = x.shape
        both = torch.cat([context, x], dim=1)  # (B, C + Q, h)
        q = self.q_norm(self.q_proj(x).view(b, q_len, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(both).view(b, -1, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(both).view(b, -1, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = position_embeddings  # (B, C + Q, d)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, layer)
        groups = self.heads // self.kv_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        mask = None if attention_mask is None else attention_mask.to(q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


class DFlashLayer(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x, context, position_embeddings, attention_mask, cache, layer: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), context, position_embeddings, attention_mask, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashHead(nn.Module):
    title, family_key = "DFlash draft model", "dflash_head"  # how errors name it, its model-config key
    shared_keys = ()  # the target's embedding and LM head are read, never stored with it

    def __init__(self, config: LlamaConfig, feature_layers: tuple[int, ...]):
        super().__init__()
        self.config = config
        h = config.hidden_size
        target_h = getattr(config, "target_hidden_size", None) or h
        self.feature_layers = tuple(feature_layers)  # the target layers whose inputs are fused
        self.block_size = int(config.block_size)
        self.mask_token_id = int(config.mask_token_id)
        self.fc = nn.Linear(len(self.feature_layers) * target_h, h, bias=False)
        self.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self._target: list[nn.Module] = []  # the target's (embedding, LM head): not submodules, not stored

    def attach_target(self, target) -> "DFlashHead":
        self._target = [target.get_input_embeddings(), target.get_output_embeddings()]
        return self

    def _shared(self, i: int) -> nn.Module:
        if not self._target:
            raise RuntimeError("DFlashHead reads the target's embedding and LM head: call attach_target(target)")
        return self._target[i]

    def drafting_lm_head(self) -> nn.Module:
        """Outputs (already through ``norm``) -> logits over the full vocabulary: the target's LM head."""
        return self._shared(1)

    def draft_token_ids(self) -> None:
        return None  # it drafts over the target's whole vocabulary

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits of outputs ``hidden`` through the target's LM head (in that head's dtype)."""
        lm_head = self.drafting_lm_head()
        return lm_head(hidden.to(lm_head.weight.dtype)).float()

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, *, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        """input_ids (B, Q) the block(s) (anchor then mask tokens); features (B, C, k*H) the tapped target features
        of C context positions; position_ids (B, C + Q) theirs then the block's; attention_mask additive (B, 1, Q,
        past + C + Q) or None (all visible). Returns the block's outputs after ``norm`` (B, Q, h)."""
        x = self._shared(0)(input_ids).to(features.dtype)
        context = self.hidden_norm(self.fc(features))
        position_embeddings = self.rotary_emb(x, position_ids=position_ids)
        for i, layer in enumerate(self.layers):
            x = layer(x, context, position_embeddings, attention_mask, cache, i)
        return self.norm(x)


def dflash_config_from_target(target_config, layers: int = 1, block_size: int = 8,
                              mask_token_id: int | None = None) -> LlamaConfig:
    """A draft config at the target's width, heads and RoPE with ``layers`` layers, a block of ``block_size``
    and the mask token (default: the target's last id)."""
    from eagle2.heads.eagle_head import head_config_from_target

    config = head_config_from_target(target_config, num_layers=layers)
    config.block_size = int(block_size)
    config.mask_token_id = int(target_config.vocab_size - 1 if mask_token_id is None else mask_token_id)
    config.num_target_layers = int(target_config.num_hidden_layers)
    return config


def _read_config(folder: Path) -> LlamaConfig:
    raw = json.loads((folder / "config.json").read_text())
    own = raw.pop("dflash_config", None)
    if own is None:
        raise KeyError(f"{folder}/config.json has no dflash_config: not a DFlash draft model")
    for key in ("block_size", "mask_token_id", "target_layer_ids"):
        if own.get(key, raw.get(key)) is None:
            raise KeyError(f"{folder}/config.json: dflash_config has no {key}")
        raw[key] = own.get(key, raw.get(key))
    for key in ("layer_types", "use_sliding_window", "sliding_window", "max_window_layers", "architectures"):
        raw.pop(key, None)  # full attention everywhere: the draft's block is short
    if "rope_theta" not in raw and not raw.get("rope_parameters") and not raw.get("rope_scaling"):
        raw["rope_theta"] = 10000.0
    raw["model_type"] = "llama"
    config = LlamaConfig(**raw)
    config._attn_implementation = "sdpa"
    return config


def load_dflash_head(location: str | Path, target) -> DFlashHead:
    """Load a DFlash draft model strictly, on the target's device and dtype, reading the target's embedding and
    LM head."""
    folder = checkpoint_folder(str(location), DFlashHead.title, f"model.{DFlashHead.family_key}")
    config = _read_config(folder)
    what = f"DFlash draft model {folder}"
    if config.hidden_size != target.config.hidden_size:
        raise ValueError(f"{what}: hidden size {config.hidden_size} != the target's {target.config.hidden_size} "
                         "(it reads the target's embedding)")
    if not 0 <= config.mask_token_id < target.config.vocab_size:
        raise ValueError(f"{what}: mask_token_id {config.mask_token_id} is outside the target's vocabulary "
                         f"({target.config.vocab_size})")
    taps = tuple(int(i) + 1 for i in config.target_layer_ids)  # outputs of layer i = inputs of layer i + 1
    if not all(0 <= t < target.config.num_hidden_layers for t in taps):
        raise ValueError(f"{what}: target_layer_ids {list(config.target_layer_ids)} do not fit a target of "
                         f"{target.config.num_hidden_layers} layers")
    head = DFlashHead(config, taps)
    state = read_weights(folder)
    expected = {k: v for k, v in head.state_dict().items() if "rotary" not in k}
    check_state(what, {k: v for k, v in state.items() if "rotary" not in k}, expected)
    head.load_state_dict(state, strict=False)
    return cast_like_target(head.attach_target(target), target).eval()


def save_dflash_head(head: DFlashHead, folder: str | Path, dtype: torch.dtype | None = None) -> Path:
    """``config.json`` (z-lab's keys) + ``model.safetensors`` (the draft's own weights only)."""
    cfg = head.config.to_dict()
    own = {"block_size": head.block_size, "mask_token_id": head.mask_token_id,
           "target_layer_ids": [i - 1 for i in head.feature_layers]}
    for key in own:
        cfg.pop(key, None)
    cfg.update(architectures=[ARCHITECTURE], block_size=head.block_size, dflash_config=own,
               num_target_layers=getattr(head.config, "num_target_layers", None),
               tie_word_embeddings=False, torch_dtype=str(dtype or head.fc.weight.dtype).replace("torch.", ""))
    return write_checkpoint(folder, cfg, {k: v for k, v in head.state_dict().items() if "rotary" not in k}, dtype)


def default_taps(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's fused layers (2, L//2, L-3); a target under 4 layers: (1, L//2, L-1) within its layers (a
    1-layer target taps its embedding output: DFlash ``target_layer_id`` -1)."""
    if num_layers >= 4:
        return eagle3_layers(num_layers)
    return tuple(min(max(t, 0), num_layers - 1) for t in (1, num_layers // 2, num_layers - 1))


def write_random(folder: str | Path, target_config, seed: int = 7) -> Path:
    """A random 2-layer DFlash draft model with a block of 8 for a target of ``target_config`` (the zoo's fixture)."""
    from eagle2.heads.shapes import fill_random

    with torch.device("meta"):  # allocated once below, no default init (the rotary buffers, never saved, stay empty)
        head = DFlashHead(dflash_config_from_target(target_config, layers=2, block_size=8),
                          default_taps(target_config.num_hidden_layers))
    fill_random(head.to_empty(device="cpu"), seed, std=0.07 / 12**0.5)  # uniform in +-0.035, norms 1
    return save_dflash_head(head, Path(folder), dtype=torch.float16)


FAMILY = Family("dflash_head", load_dflash_head, save_dflash_head, fixture="eagle2.heads.dflash_head:write_random",
                doc="DFlash draft model (z-lab's layout) for method=dflash")
