"""The PARD draft (PARallel Draft model, AMD, arXiv 2504.18583) and its format.

A small autoregressive draft LM (an SpS draft, ``eagle2.heads.draft_model``) adapted to predict K tokens in ONE
forward: behind the last committed token at position p ride K - 1 mask slots at positions p + 1 .. p + K - 1,
each reading the learned input embedding ``mask_embedding`` (H,) in place of a token's embedding and attending
causally to the context and to the slots before it. The output at p predicts depth 1 (the ordinary next-token
distribution), the slot at p + d depth d + 1. It never reads the target's features: one PARD draft serves every
target of a tokenizer family, as an SpS draft does.

The mask is a learned vector, not a token id of the vocabulary, because our SpS drafts share the target's frozen
embedding (a reserved row there could not be trained without changing the target) and because no context token
can then be mistaken for a mask: the slots are known by place (the last K - 1 inputs of a drafting forward).

Format (a local folder): an SpS draft folder, either of its formats (``config.json`` + ``model.safetensors``), so
it also loads as ``model.sps_draft``; plus ``mask_embedding.safetensors`` holding ``mask_embedding`` (H,), and in
``config.json`` the entry ``"eagle2_pard": {"para_depths": K, "mask": "mask_embedding.safetensors"}`` (K: the depths
it was trained for; drafting may ask for more, read with the same mask). A full causal-LM checkpoint published by
PARD's authors (``"pard_token": id`` in its ``config.json``, no mask file) loads too: the mask embedding is then its
own embedding's row ``pard_token``. Loading is strict: the mask file must hold exactly that key and shape.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from eagle2.core.cache import cache_kwargs
from eagle2.heads.checkpoint import WEIGHT_FILES, checkpoint_folder, load_weight_file, write_checkpoint
from eagle2.heads.draft_model import SHARED_KEYS, load_draft_model, save_draft_model
from eagle2.heads.family import Family

ENTRY, MASK_FILE, MASK_KEY = "eagle2_pard", "mask_embedding.safetensors", "mask_embedding"


class PardDraft(nn.Module):
    """A causal draft LM ``lm`` with the mask slots' input embedding; drafts through ``lm``'s own LM head."""

    title, family_key = "PARD draft", "pard_draft"

    def __init__(self, lm, para_depths: int, shares_target_embeddings: bool = True):
        super().__init__()
        self.lm, self.config, self.para_depths = lm, lm.config, int(para_depths)
        weight = lm.get_input_embeddings().weight
        self.mask_embedding = nn.Parameter(torch.zeros(weight.shape[1], dtype=weight.dtype, device=weight.device))
        # a checkpoint leaves the target's embedding and LM head out (``training.support.models.trainable_state``)
        self.shared_keys = tuple(f"lm.{k}" for k in SHARED_KEYS) if shares_target_embeddings else ()

    def drafting_lm_head(self) -> nn.Module:
        return self.lm.get_output_embeddings()

    def draft_token_ids(self) -> None:  # drafts over the full vocabulary
        return None

    def inputs_embeds(self, tokens: torch.Tensor, slots: int) -> torch.Tensor:
        """(..., n + slots, H): the embeddings of ``tokens`` (..., n), then ``slots`` mask slots."""
        embedded = self.lm.get_input_embeddings()(tokens)
        mask = self.mask_embedding.to(embedded.dtype).expand(*tokens.shape[:-1], slots, -1)
        return torch.cat([embedded, mask], dim=-2)

    def hidden(self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
               cache) -> torch.Tensor:
        """The draft LM's last hidden states (B, Q, H) over ``inputs_embeds`` (B, Q, H) at ``position_ids`` (B, Q),
        the additive ``attention_mask`` (B, 1, Q, past + Q), its entries written into ``cache`` behind the past."""
        base = self.lm.base_model
        return base(inputs_embeds=inputs_embeds, position_ids=position_ids, attention_mask=attention_mask,
                    use_cache=True, **cache_kwargs(base, cache)).last_hidden_state


def _mask_embedding(folder: Path, draft, raw_config: dict) -> torch.Tensor:
    """The mask slots' input embedding: the mask file's, or the published ``pard_token``'s embedding row."""
    path = folder / MASK_FILE
    if path.is_file():
        state = load_weight_file(path)
        want = (draft.get_input_embeddings().weight.shape[1],)
        if set(state) != {MASK_KEY} or tuple(state[MASK_KEY].shape) != want:
            raise KeyError(f"PARD draft {path}: expected exactly {MASK_KEY!r} of shape {want}, found "
                           f"{ {k: tuple(v.shape) for k, v in state.items()} }")
        return state[MASK_KEY]
    if "pard_token" in raw_config:
        return draft.get_input_embeddings().weight[int(raw_config["pard_token"])].detach().clone()
    raise FileNotFoundError(f"PARD draft {folder}: no {MASK_FILE} and no pard_token in its config.json")


def load_pard_draft(location: str | Path, target) -> PardDraft:
    """Load a PARD draft (the module docstring's format) strictly, cast like the target."""
    folder = checkpoint_folder(str(location), "PARD draft", "model.pard_draft",
                               files=("config.json", *WEIGHT_FILES, MASK_FILE))
    raw = json.loads((folder / "config.json").read_text())
    lm = load_draft_model(folder, target)
    shares = lm.get_input_embeddings() is target.get_input_embeddings()
    depths = (raw.get(ENTRY) or {}).get("para_depths") or raw.get("para_num") or 1
    draft = PardDraft(lm, depths, shares_target_embeddings=shares)
    with torch.no_grad():
        draft.mask_embedding.copy_(_mask_embedding(folder, lm, raw))
    return draft.eval()


def save_pard_draft(draft: PardDraft, folder: str | Path, dtype: torch.dtype | None = None) -> Path:
    """The SpS draft's folder (``save_draft_model``) plus the mask file and the ``eagle2_pard`` entry."""
    from safetensors.torch import save_file

    if not draft.shared_keys:  # the SpS format leaves the embedding and LM head out: they must be the target's
        raise ValueError("a PARD draft with its own embedding is stored as its authors publish it (pard_token), "
                         "not in this format")
    folder = save_draft_model(draft.lm, folder, dtype)
    save_file({MASK_KEY: draft.mask_embedding.detach().to(dtype or draft.mask_embedding.dtype).contiguous()},
              str(folder / MASK_FILE))
    config = json.loads((folder / "config.json").read_text())
    config[ENTRY] = {"para_depths": draft.para_depths, "mask": MASK_FILE}
    (folder / "config.json").write_text(json.dumps(config, indent=2, default=str))
    return folder


def write_random(folder: str | Path, target_config, seed: int = 7) -> Path:
    """A random PARD draft for a target of ``target_config`` (the zoo's fixture): a full two-layer causal LM with
    the target's vocabulary and a quarter of its width (at least 64), 4 depths, a random mask embedding."""
    from transformers import LlamaConfig

    from eagle2.heads.shapes import random_llama

    width = max(64, target_config.hidden_size // 4)
    config = LlamaConfig(vocab_size=target_config.vocab_size, hidden_size=width, intermediate_size=2 * width,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=target_config.max_position_embeddings, tie_word_embeddings=False)
    draft = PardDraft(random_llama(config, seed=seed), para_depths=4, shares_target_embeddings=False)
    with torch.no_grad():
        draft.mask_embedding.uniform_(-0.05, 0.05, generator=torch.Generator().manual_seed(seed))
    from safetensors.torch import save_file

    state = {k: v for k, v in draft.lm.state_dict().items() if "rotary" not in k}
    folder = write_checkpoint(folder, {**config.to_dict(), ENTRY: {"para_depths": 4, "mask": MASK_FILE}}, state)
    save_file({MASK_KEY: draft.mask_embedding.detach().contiguous()}, str(folder / MASK_FILE))
    return folder


FAMILY = Family("pard_draft", load_pard_draft, save_pard_draft, fixture="eagle2.heads.pard_draft:write_random",
                doc="PARD draft (an SpS draft + mask_embedding) for method=pard")
