"""The small SpS draft model for a target: a few Llama decoder layers on the target's own embedding.

``build_draft_model(target, k)`` makes a ``LlamaForCausalLM`` with ``k`` decoder layers of the target's
width and heads whose ``embed_tokens`` and ``lm_head`` ARE the target's modules (shared, frozen), so
only the layers and the final norm are trained and stored. Its layers start as copies of evenly spaced
target layers (first and last for two layers) and its norm as the target's.

Storage format (a local folder): ``config.json`` (a LlamaConfig, with an ``"eagle2_sps_draft"`` entry
marking the shared embedding) and ``model.safetensors`` with every key of the model except
``model.embed_tokens.weight`` and ``lm_head.weight``. Loading checks keys and shapes strictly and never
runs pickled code. A location that is not such a folder is an ordinary causal-LM checkpoint (a hub id
such as ``double7/vicuna-68m``, or a local copy of one: ``config.json`` + ``model.safetensors`` or an
fp16/fp32 ``pytorch_model.bin``) and is loaded with its own embedding, as strictly: every weight of
the architecture its config names must be there with its shape, nothing else may be (saved rotary
``inv_freq`` buffers are dropped with a note; ``lm_head.weight`` may be absent when the config ties it).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eagle2.heads.checkpoint import (
    cast_like_target,
    check_state,
    checkpoint_folder,
    drop_rotary_buffers,
    read_weights,
    write_checkpoint,
)
from eagle2.heads.eagle_head import head_config_from_target
from eagle2.heads.family import Family

log = logging.getLogger(__name__)

MARKER = "eagle2_sps_draft"
SHARED_KEYS = ("model.embed_tokens.weight", "lm_head.weight")


def _share_target_embeddings(draft: LlamaForCausalLM, target) -> None:
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    embed.requires_grad_(False)
    head.requires_grad_(False)
    draft.model.embed_tokens = embed
    draft.lm_head = head


def _new_draft(config: LlamaConfig, target) -> LlamaForCausalLM:
    # Build with a one-token vocabulary: the real embedding and LM head are the target's.
    small = LlamaConfig(**{**config.to_dict(), "vocab_size": 1, "tie_word_embeddings": False,
                                       "bos_token_id": None, "eos_token_id": None, "pad_token_id": None})
    small._attn_implementation = config._attn_implementation
    draft = LlamaForCausalLM(small)
    draft.config = draft.model.config = config
    draft.model.vocab_size = config.vocab_size
    _share_target_embeddings(draft, target)
    return draft.to(target.device, target.dtype)


def layer_sources(target_layers: int, num_layers: int) -> list[int]:
    """Evenly spaced target layer indices, first and last included when ``num_layers >= 2``."""
    if num_layers == 1:
        return [target_layers - 1]
    return [round(i * (target_layers - 1) / (num_layers - 1)) for i in range(num_layers)]


def build_draft_model(target, num_layers: int, init_from_target: bool = True) -> LlamaForCausalLM:
    """A fresh ``num_layers``-layer draft sharing the target's embedding and LM head (eval mode)."""
    if num_layers < 1:
        raise ValueError("a draft model needs at least one decoder layer")
    config = head_config_from_target(target.config, num_layers)  # the target's LlamaConfig, num_layers layers
    config.architectures = ["LlamaForCausalLM"]
    draft = _new_draft(config, target)
    if init_from_target:
        src_layers = target.base_model.layers
        for dst, src in zip(draft.model.layers, layer_sources(len(src_layers), num_layers)):
            dst.load_state_dict(src_layers[src].state_dict())
        draft.model.norm.load_state_dict(target.base_model.norm.state_dict())
    return draft.eval()


def own_state_dict(draft) -> dict[str, torch.Tensor]:
    """The draft's weights without the shared embedding and LM head."""
    return {k: v for k, v in draft.state_dict().items() if k not in SHARED_KEYS}


def save_draft_model(draft, folder: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (no embedding, no LM head)."""
    cfg = {**draft.config.to_dict(), MARKER: {"shares_target_embeddings": True}}
    return write_checkpoint(folder, cfg, own_state_dict(draft), dtype)


def _is_shared_format(folder: Path) -> bool:
    config = folder / "config.json"
    return config.is_file() and MARKER in json.loads(config.read_text())


def _load_shared_format(folder: Path, target) -> LlamaForCausalLM:
    raw = json.loads((folder / "config.json").read_text())
    raw.pop(MARKER)
    config = LlamaConfig(**raw)
    config._attn_implementation = getattr(target.config, "_attn_implementation", None) or "sdpa"
    if config.hidden_size != target.config.hidden_size:
        raise ValueError(f"SpS draft {folder}: hidden_size {config.hidden_size} does not match the "
                         f"target's {target.config.hidden_size}")
    draft = _new_draft(config, target)
    state = read_weights(folder)
    check_state(f"SpS draft {folder}", state, own_state_dict(draft))
    draft.load_state_dict(state, strict=False)  # the shared keys stay the target's
    return draft


def _load_full_checkpoint(folder: Path, target):
    """An ordinary causal-LM checkpoint with its own embedding and LM head, checked key by key."""
    from transformers import AutoConfig, AutoModelForCausalLM

    what = f"SpS draft {folder}"
    raw = json.loads((folder / "config.json").read_text())
    config = AutoConfig.from_pretrained(folder) if "model_type" in raw else LlamaConfig(**raw)  # Llama if unsaid
    config._attn_implementation = getattr(target.config, "_attn_implementation", None) or "sdpa"
    with torch.device("meta"):  # no random init: every weight comes from the file
        draft = AutoModelForCausalLM.from_config(config)
    state = read_weights(folder)
    drop_rotary_buffers(what, state)
    expected = draft.state_dict()
    tied = bool(getattr(config, "tie_word_embeddings", False))
    check_state(what, state, expected, optional={"lm_head.weight"} if tied else set())
    draft.load_state_dict(state, strict=not tied, assign=True)
    if tied:
        draft.tie_weights()
    for module in draft.modules():  # rotary buffers are computed from the config, never stored
        if any(b.is_meta for b in getattr(module, "rotary_emb", torch.nn.Module()).buffers()):
            module.rotary_emb = type(module.rotary_emb)(config)
    left = [n for n, t in [*draft.named_parameters(), *draft.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"{what}: nothing in the checkpoint for {left}")
    if config.vocab_size != target.config.vocab_size:
        log.warning("SpS draft %s has vocab_size %d, the target %d", folder, config.vocab_size,
                    target.config.vocab_size)
    return draft


def load_draft_model(location: str | Path, target):
    """Load an SpS draft: our shared-embedding folder, else an ordinary causal-LM checkpoint."""
    folder = checkpoint_folder(str(location), "SpS draft", "model.sps_draft")
    if _is_shared_format(folder):
        draft = _load_shared_format(folder, target)
    else:
        draft = _load_full_checkpoint(folder, target)
    return cast_like_target(draft, target).eval()


FAMILY = Family("sps_draft", load_draft_model, save_draft_model, fixture="tests.zoo_fixtures:write_full_draft",
                doc="small draft LM (hub id or local folder) for method=sps")
