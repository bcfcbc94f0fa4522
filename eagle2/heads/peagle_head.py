"""The P-EAGLE draft head (Parallel EAGLE, arXiv 2602.01469; vLLM's parallel drafting), and its format.

The EAGLE-3 architecture (``eagle2.heads.eagle3_head``: three tapped target layers fused by ``fc``, one
Llama-style layer, its own norm and LM head over a draft vocabulary) drafting ``para_depths`` (K) tokens in ONE
forward. Behind the last committed pair (token, fused feature) at position p ride K - 1 mask slots at positions
p + 1 .. p + K - 1: each reads the mask token ``ptd_token_id`` (through the target's embedding) and the learned
``mask_hidden`` in place of the tapped features (it goes through ``fc`` as they do), attending causally to the
context and to the slots before it. The output at p predicts depth 1, the slot at p + d predicts depth d + 1.
No slot reads a drafted token: each depth's distribution is the head's guess over what the earlier depths
will be, so a round costs one head forward whatever its depth.

Checkpoint format: an EAGLE-3 head's (``config.json`` + ``model.safetensors``, loaded by the same strict reader)
plus the weight ``mask_hidden`` [1, 1, k*H] and, in ``config.json``, ``para_depths`` (K, the depths it was
trained for), ``ptd_token_id`` (the mask token) and the architecture ``PeagleLlamaForCausalLM`` (speculators'
names).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from eagle2.heads.eagle3_head import Eagle3Head, eagle3_config_from_target, load_eagle3_head, save_eagle3_head
from eagle2.heads.family import Family

ARCHITECTURE = "PeagleLlamaForCausalLM"


class PEagleHead(Eagle3Head):
    title, family_key = "P-EAGLE head", "peagle_head"

    def __init__(self, config, feature_layers: tuple[int, ...]):
        super().__init__(config, feature_layers)
        target_h = getattr(config, "target_hidden_size", None) or config.hidden_size
        self.para_depths = int(getattr(config, "para_depths", None) or 1)
        self.mask_token_id = int(getattr(config, "ptd_token_id", None) or config.vocab_size - 1)
        self.mask_hidden = nn.Parameter(torch.zeros(1, 1, len(self.feature_layers) * target_h))

    def mask_slots(self, count: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(count,) mask tokens and (count, k*H) mask features: the inputs of ``count`` parallel slots."""
        tokens = torch.full((count,), self.mask_token_id, dtype=torch.long, device=device)
        return tokens, self.mask_hidden[0, 0].expand(count, -1)


def peagle_config_from_target(target_config, draft_vocab_size: int, para_depths: int, mask_token_id: int | None = None):
    """An EAGLE-3 head config for ``target_config`` with P-EAGLE's depths and mask token (default: the last id)."""
    config = eagle3_config_from_target(target_config, draft_vocab_size)
    config.para_depths = int(para_depths)
    config.ptd_token_id = int(target_config.vocab_size - 1 if mask_token_id is None else mask_token_id)
    return config


def load_peagle_head(location: str | Path, target) -> PEagleHead:
    """Load a P-EAGLE head strictly (the EAGLE-3 reader, ``mask_hidden`` expected too)."""
    head = load_eagle3_head(location, target, head_class=PEagleHead)
    if not 0 <= head.mask_token_id < target.config.vocab_size:
        raise ValueError(f"P-EAGLE head {location}: ptd_token_id {head.mask_token_id} is outside the target's "
                         f"vocabulary ({target.config.vocab_size})")
    return head


def save_peagle_head(head: PEagleHead, folder: str | Path, dtype: torch.dtype | None = None) -> Path:
    """The EAGLE-3 layout with ``mask_hidden``, its config naming P-EAGLE's architecture, depths and mask token."""
    folder = save_eagle3_head(head, folder, dtype)
    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=[ARCHITECTURE], para_depths=head.para_depths, ptd_token_id=head.mask_token_id)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def write_random(folder: str | Path, target_config, seed: int = 6) -> Path:
    """A random P-EAGLE head for a target of ``target_config`` (the zoo's fixture): 4 depths, a draft vocabulary
    of a quarter of the target's; a target under 4 layers fuses layers (0, L//2, L-1)."""
    from eagle2.heads.shapes import fill_random

    layers = target_config.num_hidden_layers
    fused = (2, layers // 2, layers - 3) if layers >= 4 else (0, layers // 2, layers - 1)
    gen = torch.Generator().manual_seed(seed)
    draft = max(target_config.vocab_size // 4, 1)
    with torch.device("meta"):  # allocated once below, no default init (the rotary buffers, never saved, stay empty)
        head = PEagleHead(peagle_config_from_target(target_config, draft, para_depths=4), fused)
    fill_random(head.to_empty(device="cpu"), seed, std=0.07 / 12**0.5)  # uniform in +-0.035, norms 1
    head.set_draft_vocabulary(torch.randperm(target_config.vocab_size, generator=gen)[:draft])
    return save_peagle_head(head, Path(folder), dtype=torch.float16)


FAMILY = Family("peagle_head", load_peagle_head, save_peagle_head, fixture="eagle2.heads.peagle_head:write_random",
                doc="P-EAGLE head (the EAGLE-3 layout + mask_hidden) for method=peagle")
