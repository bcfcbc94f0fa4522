"""Drafters: each turns the committed context into a DraftTree. ``build_drafter`` picks one from the
``method`` config; the engine never knows which one it runs."""

from __future__ import annotations

import logging

from eagle2.drafters.eagle2_dynamic import Eagle2Drafter
from eagle2.drafters.eagle_static import EagleStaticDrafter
from eagle2.drafters.plain import PlainDrafter
from eagle2.drafters.sps import SpsDrafter
from eagle2.models import resolve_dtype

log = logging.getLogger(__name__)
METHODS = ("plain", "sps", "eagle", "eagle2")


def draft_vocabulary(head, size):
    """The ``size`` most frequent token ids of the head's shipped draft vocabulary (None = full vocab)."""
    if not size:
        return None
    if getattr(head, "draft_vocab", None) is None:
        log.warning("method.draft_vocab_size=%s but this EAGLE head ships no draft_vocab.safetensors: "
                    "drafting over the full vocabulary", size)
        return None
    return head.draft_vocab[: int(size)]


def build_drafter(method_cfg, target, params, generator, *, head=None, draft_model=None):
    name = method_cfg.name
    if name == "plain":
        return PlainDrafter()
    if name == "sps":
        if draft_model is None:
            raise ValueError("method=sps needs a draft model (model.sps_draft)")
        return SpsDrafter(draft_model, params, int(method_cfg.k), generator, method_cfg.get("draft_temperature"))
    if name in ("eagle", "eagle2") and head is None:
        raise ValueError(f"method={name} needs an EAGLE head (model.head)")
    drafting = {"lm_head_dtype": resolve_dtype(method_cfg.draft_lm_head_dtype)
                if method_cfg.get("draft_lm_head_dtype") else None,
                "vocab": draft_vocabulary(head, method_cfg.get("draft_vocab_size"))}
    if name == "eagle":
        return EagleStaticDrafter(head, target.lm_head, target.device, choices=list(method_cfg.choices), **drafting)
    if name == "eagle2":
        depth, top_k, total, profile = int(method_cfg.depth), int(method_cfg.top_k), method_cfg.total_tokens, None
        if str(total) == "auto":
            from eagle2.cost_profile import get_profile

            total = int(method_cfg.get("max_total_tokens") or 64)
            profile = get_profile(target, head, drafting, depth=depth, top_k=top_k,
                                  profile_dir=method_cfg.get("profile_dir"),
                                  remeasure=bool(method_cfg.get("reprofile", False)), max_q=total + 1)
        elif not str(total).isdigit():
            raise ValueError(f"method.total_tokens must be a positive integer or auto, not {total!r}")
        return Eagle2Drafter(head, target.lm_head, target.device, depth=depth, top_k=top_k,
                             total_tokens=int(total), profile=profile, **drafting)
    raise ValueError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
