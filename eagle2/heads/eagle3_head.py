"""The EAGLE-3 draft head (Li et al., 2025), and its published checkpoint format.

Wiring (as in the authors' heads): position i reads the token ``t[i+1]`` and a feature ``g[i]``. For
committed context ``g[i] = fc(concat(x2[i], x_{L//2}[i], x_{L-3}[i]))``, the target's hidden states
entering decoder layers 2, L//2 and L-3 (``eagle2.core.features``); a tree node deeper than one step reads
the head's own output at its parent instead (already ``h`` wide, so ``fc`` is skipped). One decoder
layer whose attention input is ``concat(input_layernorm(embed(t)), hidden_norm(g))`` (q/k/v take 2h),
residual ``g``, then the usual post-attention norm and MLP. Its output goes through the head's own
``norm`` and ``lm_head`` over a reduced draft vocabulary: draft id ``d`` is target token
``d + d2t[d]``; ``t2d`` marks, over the target vocabulary, the tokens that have a draft id.

Checkpoint format (a folder, local or a hub id): ``config.json`` = a LlamaConfig with
``num_hidden_layers = 1``, ``draft_vocab_size`` and optionally ``target_hidden_size``; weights in
``model.safetensors`` or ``pytorch_model.bin`` with keys ``fc.weight`` [h, 3H],
``midlayer.self_attn.{q,k,v}_proj.weight`` [., 2h], ``midlayer.self_attn.o_proj.weight``,
``midlayer.mlp.{gate,up,down}_proj.weight``, ``midlayer.{hidden_norm,input_layernorm,
post_attention_layernorm}.weight``, ``norm.weight``, ``lm_head.weight`` [draft_vocab, h], ``d2t``,
``t2d`` (both optional when the draft vocabulary is the full one) and optionally
``embed_tokens.weight`` (else the target's embedding is used). Loading is strict, never runs pickled
code, and names a bad key.

EAGLE-3.1 (two ``config.json`` flags, absent in EAGLE-3 heads, which load unchanged): ``tap_norms`` puts one
RMSNorm on each tapped feature before ``fc`` (weights ``tap_norms.{k}.weight`` [H]), and
``norm_before_residual`` (vLLM's key and meaning) makes ``hidden_norm(g)`` the residual stream too, so the
output a deeper tree node reads is built on the normed state.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from eagle2.core.features import eagle3_layers
from eagle2.heads.checkpoint import (
    cast_like_target,
    check_state,
    checkpoint_folder,
    read_weights,
    shared_or_own_embedding,
    write_checkpoint,
)
from eagle2.heads.eagle_head import ReadsTargetEmbedding, head_config_from_target
from eagle2.heads.family import Family


class Eagle3Attention(nn.Module):
    """Self-attention over the 2h-wide input, with its own KV cache layer (``cache.update``)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        h = config.hidden_size
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or h // self.heads
        self.q_proj = nn.Linear(2 * h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)

    def forward(self, x, position_embeddings, attention_mask, cache=None) -> torch.Tensor:
        b, q_len, _ = x.shape
        q = self.q_proj(x).view(b, q_len, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, q_len, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, q_len, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
        if cache is not None:
            k, v = cache.update(k, v, 0)
        groups = self.heads // self.kv_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask.to(q.dtype))
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


class Eagle3Layer(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        eps = config.rms_norm_eps
        self.norm_before_residual = bool(getattr(config, "norm_before_residual", False))  # EAGLE-3.1
        self.self_attn = Eagle3Attention(config)
        self.mlp = LlamaMLP(config)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=eps)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=eps)

    def forward(self, embeds, hidden, position_embeddings, attention_mask, cache=None) -> torch.Tensor:
        normed = self.hidden_norm(hidden)
        if self.norm_before_residual:
            hidden = normed
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        hidden = hidden + self.self_attn(x, position_embeddings, attention_mask, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Head(ReadsTargetEmbedding):  # the target's embedding unless the checkpoint has its own
    title, family_key = "EAGLE-3 head", "eagle3_head"  # how errors name it, its model-config key
    shared_keys = ()  # nothing of the target is stored with it (its embedding is kept out of the state)

    def __init__(self, config: LlamaConfig, feature_layers: tuple[int, ...]):
        super().__init__()
        self.config = config
        h = config.hidden_size
        target_h = getattr(config, "target_hidden_size", None) or h
        self.draft_vocab_size = int(getattr(config, "draft_vocab_size", None) or config.vocab_size)
        self.feature_layers = tuple(feature_layers)  # the target layers whose inputs are fused
        self.fc = nn.Linear(len(self.feature_layers) * target_h, h, bias=False)
        if getattr(config, "tap_norms", False):  # EAGLE-3.1: each tapped feature normed before the fusion
            self.tap_norms = nn.ModuleList(LlamaRMSNorm(target_h, eps=config.rms_norm_eps)
                                           for _ in self.feature_layers)
        else:
            self.tap_norms = None
        self.midlayer = Eagle3Layer(config)
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, self.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary_emb = LlamaRotaryEmbedding(config)

    def set_draft_vocabulary(self, token_ids: torch.Tensor) -> None:
        """Draft over ``token_ids`` (target ids): stored sorted, as ``d2t``/``t2d`` in the official layout."""
        ids = torch.unique(token_ids.long().cpu())  # sorted
        if len(ids) != self.draft_vocab_size:
            raise ValueError(f"{len(ids)} distinct draft tokens for a draft vocabulary of {self.draft_vocab_size}")
        self.d2t.copy_(ids - torch.arange(len(ids)))
        self.t2d.zero_()
        self.t2d[ids] = True

    def draft_token_ids(self) -> torch.Tensor | None:
        """The target token id of each ``lm_head`` row (None when the draft vocabulary is the full one)."""
        if self.draft_vocab_size == self.config.vocab_size:
            return None
        return torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t

    def drafting_lm_head(self) -> nn.Module:
        """Features -> draft-vocabulary logits: the head's own ``norm`` then ``lm_head``."""
        return nn.Sequential(self.norm, self.lm_head)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """(..., k*H) tapped target features -> (..., h): ``fc``, after each tap's own norm (EAGLE-3.1)."""
        if self.tap_norms is not None:
            parts = features.chunk(len(self.tap_norms), dim=-1)
            features = torch.cat([norm(part) for norm, part in zip(self.tap_norms, parts)], dim=-1)
        return self.fc(features)

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, *, position_ids: torch.Tensor,
                attention_mask: torch.Tensor, cache=None) -> torch.Tensor:
        """input_ids (B, Q) tokens t[i+1]; features (B, Q, 3H) fused target layers or (B, Q, h) the
        head's own outputs; attention_mask additive (B, 1, Q, past+Q). Returns (B, Q, h)."""
        emb = self.embed_tokens(input_ids).to(features.dtype)
        hidden = self.fuse(features) if features.shape[-1] != self.config.hidden_size else features
        pos_emb = self.rotary_emb(hidden, position_ids=position_ids)
        return self.midlayer(emb, hidden, pos_emb, attention_mask, cache)


EAGLE31_FLAGS = ("tap_norms", "norm_before_residual")  # config.json flags of an EAGLE-3.1 head


def eagle3_config_from_target(target_config, draft_vocab_size: int, eagle31: bool = False) -> LlamaConfig:
    """A head config matching the target's width, heads and RoPE, with a draft vocabulary; ``eagle31``: with
    EAGLE-3.1's norms (``EAGLE31_FLAGS``)."""
    config = head_config_from_target(target_config, num_layers=1)
    config.draft_vocab_size = int(draft_vocab_size)
    for flag in EAGLE31_FLAGS if eagle31 else ():
        setattr(config, flag, True)
    config.target_num_hidden_layers = int(target_config.num_hidden_layers)  # (not exported: tells a default)
    return config


def _read_config(folder: Path) -> LlamaConfig:
    raw = json.loads((folder / "config.json").read_text())
    if "draft_vocab_size" not in raw:
        raise KeyError(f"{folder}/config.json has no draft_vocab_size: not an EAGLE-3 head (for an EAGLE-1/2 "
                       "head use model.head with method=eagle/eagle2)")
    if "rope_theta" not in raw and "rope_parameters" not in raw and "rope_scaling" not in raw:
        raw["rope_theta"] = 10000.0  # the authors' code defaults to this
    raw["model_type"] = "llama"
    return LlamaConfig(**raw)


def _feature_layers(config: LlamaConfig, target) -> tuple[int, ...]:
    """The fused target layers (the layers whose INPUTS are fused): the top-level
    ``eagle_aux_hidden_state_layer_ids`` when the checkpoint names them (vLLM's key and meaning), else
    ``eagle_config.eagle_aux_hidden_state_layer_ids`` as this project's earlier exports wrote it (same
    meaning), else EAGLE-3's default for the target's depth."""
    named = getattr(config, "eagle_aux_hidden_state_layer_ids", None) or (
        getattr(config, "eagle_config", None) or {}).get("eagle_aux_hidden_state_layer_ids")
    return tuple(int(i) for i in named) if named else eagle3_layers(target.config.num_hidden_layers)


def load_eagle3_head(location: str | Path, target, head_class: type | None = None) -> Eagle3Head:
    """Load a head in the official EAGLE-3 format, strictly, on the target's device and dtype. ``head_class``: a
    head of the EAGLE-3 architecture with weights of its own (P-EAGLE's, ``eagle2.heads.peagle_head``), whose
    extra keys are then expected too."""
    head_class = head_class or Eagle3Head
    folder = checkpoint_folder(str(location), head_class.title, f"model.{head_class.family_key}")
    config = _read_config(folder)
    if config.vocab_size != target.config.vocab_size:
        raise ValueError(f"EAGLE-3 head {folder}: vocab_size {config.vocab_size} != the target's "
                         f"{target.config.vocab_size}")
    config._attn_implementation = "sdpa"
    config.target_num_hidden_layers = int(target.config.num_hidden_layers)
    head = head_class(config, _feature_layers(config, target))
    state = read_weights(folder)
    embed = state.pop("embed_tokens.weight", None)
    expected = head.state_dict()
    full_vocab = head.draft_vocab_size == config.vocab_size
    optional = {k for k in expected if "rotary" in k} | ({"d2t", "t2d"} if full_vocab else set())
    check_state(f"EAGLE-3 head {folder}", state, expected, optional=optional)
    if state["fc.weight"].shape[1] != len(head.feature_layers) * target.config.hidden_size:
        raise ValueError(f"EAGLE-3 head {folder}: fc.weight reads {state['fc.weight'].shape[1]} features, the "
                         f"target gives {len(head.feature_layers)} x {target.config.hidden_size}")
    head.load_state_dict(state, strict=False)
    ids = head.draft_token_ids()
    if ids is not None and (int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size):
        raise ValueError(f"EAGLE-3 head {folder}: d2t maps draft ids outside the target vocabulary")
    if embed is not None:
        head.attach_embedding(shared_or_own_embedding(f"EAGLE-3 head {folder}", embed, target))
    elif config.hidden_size != target.config.hidden_size:
        raise ValueError(f"EAGLE-3 head {folder}: hidden size {config.hidden_size} differs from the target's "
                         "and the checkpoint has no embed_tokens.weight")
    else:
        head.attach_embedding(target.get_input_embeddings())
    return cast_like_target(head, target).eval()


def serving_config(head: Eagle3Head, dtype: torch.dtype | None = None) -> dict:
    """``config.json`` of an export, with what the serving engines read (``tests/test_eagle3_export.py``
    cites their code): the architecture SGLang's class is named and vLLM's registry maps
    (``LlamaForCausalLMEagle3``); ``draft_vocab_size``; ``tie_word_embeddings: false`` (SGLang would
    otherwise use the embedding as the LM head and skip ``lm_head.weight``); ``rope_theta`` at the top
    level as well (readers on transformers 4.x do not read ``rope_parameters``); ``torch_dtype``; and the
    fused layers only when they are not EAGLE-3's default (2, L//2, L-3), which all readers assume:
    top-level ``eagle_aux_hidden_state_layer_ids`` in vLLM's meaning (the layers whose inputs are fused,
    as here) and ``eagle_config.eagle_aux_hidden_state_layer_ids`` in SGLang's (the layers whose
    outputs are: one less)."""
    cfg = head.config.to_dict()
    cfg.pop("eagle_aux_hidden_state_layer_ids", None)  # (a loaded head's: written again below if needed)
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta")
    cfg.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=head.draft_vocab_size,
               tie_word_embeddings=False, eagle_config={"use_aux_hidden_state": True})
    if theta is not None:
        cfg["rope_theta"] = float(theta)
    stored = dtype or head.lm_head.weight.dtype
    cfg["torch_dtype"] = str(stored).replace("torch.", "")
    target_layers = getattr(head.config, "target_num_hidden_layers", None)
    default = eagle3_layers(int(target_layers)) if target_layers is not None and int(target_layers) >= 4 else None
    if default is None or tuple(head.feature_layers) != default:  # (a target under 4 layers has no default)
        cfg["eagle_aux_hidden_state_layer_ids"] = list(head.feature_layers)
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i - 1 for i in head.feature_layers]
    cfg.pop("target_num_hidden_layers", None)
    for flag in EAGLE31_FLAGS:  # written only when on: an EAGLE-3 head's config stays as the readers know it
        if not cfg.get(flag):
            cfg.pop(flag, None)
    return cfg


def save_eagle3_head(head: Eagle3Head, folder: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write ``config.json`` (``serving_config``) + ``model.safetensors`` (no embedding) in the official
    layout, which the authors' code, vLLM and SGLang load."""
    state = {k: v for k, v in head.state_dict().items() if "rotary" not in k}
    return write_checkpoint(folder, serving_config(head, dtype), state, dtype)


FAMILY = Family("eagle3_head", load_eagle3_head, save_eagle3_head, fixture="tests.zoo_fixtures:write_eagle3_head",
                doc="EAGLE-3 head (official layout; hub id or local folder) for method=eagle3")
