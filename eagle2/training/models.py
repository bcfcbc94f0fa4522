"""The models being trained: a fresh EAGLE or EAGLE-3 head for a target, and what of a trained module is
stored."""

from __future__ import annotations

import torch

from eagle2.core.features import eagle3_layers
from eagle2.heads.eagle3_head import Eagle3Head, eagle3_config_from_target
from eagle2.heads.eagle_head import EagleHead, head_config_from_target

SHARED_KEYS = ("model.embed_tokens.weight", "lm_head.weight")  # the target's, never stored with a drafter


def new_head(target, init_from_target: bool = False, num_layers: int = 1) -> EagleHead:
    """A fresh fp32 head for ``target``: default (random) init, or its layer from the target's last
    decoder layer and ``fc = [0 | I]`` so the feature passes straight through at the start. On
    SmolLM2 the latter trained worse (30 steps: held-out top-1 0.016 vs 0.23 for random init; 0.066
    with the copied layer's o_proj/down_proj zeroed), so random init is the default."""
    head = EagleHead(head_config_from_target(target.config, num_layers), bias=True)
    if init_from_target:
        last = target.base_model.layers[-1]
        layer = head.layers[0]
        layer.self_attn.load_state_dict(last.self_attn.state_dict())
        layer.mlp.load_state_dict(last.mlp.state_dict())
        layer.post_attention_layernorm.load_state_dict(last.post_attention_layernorm.state_dict())
        h = head.config.hidden_size
        with torch.no_grad():
            head.fc.weight.zero_()
            head.fc.weight[:, h:].copy_(torch.eye(h))
            if head.fc.bias is not None:
                head.fc.bias.zero_()
    head.attach_embedding(target.get_input_embeddings())
    return head.to(target.device, torch.float32)


def trainable_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint stores: everything but rotary buffers and the target's shared weights (a module
    with its own LM head, such as an EAGLE-3 head, says so with ``shared_keys = ()``)."""
    shared = getattr(module, "shared_keys", SHARED_KEYS)
    return {k: v for k, v in module.state_dict().items() if k not in shared and "rotary" not in k}


def new_eagle3_head(target, draft_ids: torch.Tensor) -> Eagle3Head:
    """A fresh fp32 EAGLE-3 head for ``target`` drafting over the target tokens ``draft_ids``: random
    ``fc`` and layer, its ``norm`` and ``lm_head`` started from the target's final norm and the target's
    LM-head rows of those tokens (the head then begins as the target's own read-out)."""
    L = target.config.num_hidden_layers
    head = Eagle3Head(eagle3_config_from_target(target.config, len(torch.unique(draft_ids))), eagle3_layers(L))
    head.set_draft_vocabulary(draft_ids)
    with torch.no_grad():
        head.norm.weight.copy_(target.base_model.norm.weight)
        ids = head.draft_token_ids()
        weight = target.get_output_embeddings().weight
        head.lm_head.weight.copy_(weight if ids is None else weight[ids.to(weight.device)])
    head.attach_embedding(target.get_input_embeddings())
    return head.to(target.device, torch.float32)


EXPORT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def export_dtype(module: torch.nn.Module, max_mb: float, dtype: str = "auto") -> torch.dtype:
    """The dtype an export stores: ``dtype`` as configured (``train.export.dtype``: bfloat16, float16,
    float32), or for ``auto`` fp32 if the stored weights fit in ``max_mb`` MB, else fp16."""
    if dtype != "auto":
        if dtype not in EXPORT_DTYPES:
            raise ValueError(f"export dtype {dtype!r}: expected auto or one of {sorted(EXPORT_DTYPES)}")
        return EXPORT_DTYPES[dtype]
    numel = sum(v.numel() for v in trainable_state(module).values())
    return torch.float32 if numel * 4 <= max_mb * 1e6 else torch.float16
