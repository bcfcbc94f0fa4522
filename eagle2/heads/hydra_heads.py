"""Hydra heads (Ankner et al., 2024): Medusa-style heads made sequentially dependent on the draft path.

Head k (k = 0..K-1) predicts token t+k+2 from the target's post-norm last hidden state ``f[t]`` AND the
input embeddings of the k+1 tokens before it on the path: the token t+1 (the verified root) and the
tokens that heads 0..k-1 drafted. So a node's children depend on its own path, and the tree is drafted
depth by depth (``eagle2.drafters.hydra``), not as Medusa's product of per-head top-k lists.

Architecture (from the paper and the authors' ``hydra/model/hydra_heads/prefix_mlp_head.py``): the first
block of head k reads the concatenation ``z = [f; e(x[t+1]); ...; e(x[t+k+1])]`` (width H*(k+2)) with
the target's own (frozen) input embedding ``e``, ``x + SiLU(W z + b)``; further blocks are Medusa's
``x + SiLU(W x + b)``; then an LM head. The authors' first block takes the residual ``x`` through a
learned H*(k+2) -> H projection; here it is ``f`` itself (no parameters, and the head starts as the
identity on ``f`` like Medusa's). ``rank`` (our option, for the size budget) factors ``W`` as
``up @ down`` through ``rank`` dimensions (one rank for all heads, or a list, one per head); null is the
authors' full matrix. Not built: Hydra++'s
prefix-attention layer (an extra decoder layer over the hidden states) and the authors' own LM heads by
default (the heads share the target's frozen LM head over a reduced draft vocabulary, as the SmolLM2
Medusa heads do; ``vocab_size`` gives them their own).

Format (ours; the authors' checkpoints also hold the prefix layer and are not read): ``config.json``
(``hydra_num_heads``, ``hydra_num_layers``, ``hidden_size``, ``rank`` (a number, a list or null),
``shared_lm_head``) and
``hydra_heads.safetensors`` with keys ``{k}.0.linear.weight`` [H, H*(k+2)] + ``{k}.0.linear.bias``
(full rank) or ``{k}.0.down.weight`` [r, H*(k+2)] + ``{k}.0.up.weight`` [H, r] + ``{k}.0.up.bias``,
``{k}.{l}.linear.*`` for the blocks l >= 1, ``{k}.{L}.weight`` for an own LM head; plus
``draft_vocab.safetensors`` (``token_ids``) as the Medusa heads'. Loading is strict and safe
(``eagle2.heads.checkpoint``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from eagle2.heads.checkpoint import check_state, checkpoint_folder, load_weight_file
from eagle2.heads.family import Family
from eagle2.heads.medusa_heads import DRAFT_VOCAB_FILE, HeadStack, ResBlock, read_draft_vocab, save_head_stack

CONFIG_FILE = "config.json"
WEIGHT_FILE = "hydra_heads.safetensors"


class PathBlock(nn.Module):
    """Head k's first block: ``f + SiLU(W [f; e_1; ...; e_{k+1}] + b)``, W zero at the start."""

    def __init__(self, hidden: int, path_len: int, rank: int | None = None):
        super().__init__()
        width = hidden * (path_len + 1)
        if rank:
            self.down = nn.Linear(width, rank, bias=False)
            self.up = nn.Linear(rank, hidden)
            nn.init.zeros_(self.up.weight)
        else:
            self.linear = nn.Linear(width, hidden)
            nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, hidden: torch.Tensor, path_embeds: torch.Tensor) -> torch.Tensor:
        """hidden (..., H), path_embeds (..., k+1, H) -> (..., H)."""
        z = torch.cat([hidden, path_embeds.flatten(-2)], dim=-1)  # (..., H*(k+2))
        return hidden + self.act(self.up(self.down(z)) if hasattr(self, "up") else self.linear(z))


class HydraHeads(HeadStack):
    """K Hydra heads; head k = ``PathBlock`` (path of k+1 tokens), then ``num_layers - 1`` ``ResBlock``s,
    then its own LM head (``vocab_size``) or the target's (``attach_lm_head``). The path's embeddings come
    from the target's input embedding (``attach_embedding``, kept out of the state dict)."""

    reads_path = True

    def __init__(self, num_heads: int, num_layers: int, hidden: int, vocab_size: int | None = None,
                 rank: int | list[int] | None = None):
        if num_layers < 1:
            raise ValueError("Hydra heads need at least one block (the one that reads the path)")
        ranks = list(rank) if isinstance(rank, (list, tuple)) else [rank] * num_heads  # one per head, or for all
        if len(ranks) != num_heads:
            raise ValueError(f"rank {rank} names {len(ranks)} heads' ranks for {num_heads} heads")
        blocks = [[PathBlock(hidden, k + 1, ranks[k]), *(ResBlock(hidden) for _ in range(num_layers - 1))]
                  for k in range(num_heads)]
        super().__init__(blocks, num_layers, hidden, vocab_size)
        self.rank = (list(rank) if isinstance(rank, (list, tuple)) else rank) or None
        self._embedding: list[nn.Module] = []

    def attach_embedding(self, embedding: nn.Module) -> "HydraHeads":
        self._embedding = [embedding]
        return self

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        if not self._embedding:
            raise RuntimeError("HydraHeads read the target's token embeddings: call attach_embedding(...)")
        return self._embedding[0](tokens)

    def head_features(self, k: int, hidden: torch.Tensor, path: torch.Tensor | None = None,
                      path_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """(..., H) head ``k``'s features from hidden states (..., H) and the path's k+1 tokens (..., k+1)
        (or their embeddings ``path_embeds`` (..., k+1, H))."""
        if path_embeds is None:
            if path is None or path.shape[-1] != k + 1:
                raise ValueError(f"Hydra head {k} reads a path of {k + 1} tokens")
            path_embeds = self.embed(path)
        x = self[k][0](hidden, path_embeds.to(hidden.dtype))
        return self[k][1: self.num_layers](x)

    def config(self, **extra) -> dict:
        return {"hydra_num_heads": len(self), "hydra_num_layers": self.num_layers, "hidden_size": self.hidden,
                "rank": self.rank, "shared_lm_head": not self.own_lm_head, **extra}


def heads_from_state(state: dict[str, torch.Tensor], config: dict, what: str) -> HydraHeads:
    """Empty heads shaped as the config says, checked strictly against ``state`` (a key outside the
    format, a missing key or a wrong shape raises naming it)."""
    try:
        num_heads, layers, hidden = (int(config[k]) for k in ("hydra_num_heads", "hydra_num_layers", "hidden_size"))
    except KeyError as exc:
        raise KeyError(f"{what}: {CONFIG_FILE} lacks {exc}") from None
    own = state.get(f"0.{layers}.weight")
    heads = HydraHeads(num_heads, layers, hidden, None if own is None else own.shape[0], config.get("rank"))
    check_state(what, state, heads.state_dict())
    heads.load_state_dict(state)
    return heads


def load_hydra_heads(location: str | Path, target) -> HydraHeads:
    """Load heads strictly, on the target's device and dtype, reading the target's embedding (and its LM
    head when they share it)."""
    folder = checkpoint_folder(str(location), "Hydra heads", "model.hydra_head", (CONFIG_FILE, DRAFT_VOCAB_FILE,
                                                                                  WEIGHT_FILE))
    if not (folder / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"Hydra heads {folder}: no {CONFIG_FILE}")
    heads = heads_from_state(load_weight_file(folder / WEIGHT_FILE), json.loads((folder / CONFIG_FILE).read_text()),
                             f"Hydra heads {folder}")
    if heads.hidden != target.config.hidden_size:
        raise ValueError(f"Hydra heads {folder} have width {heads.hidden}, the target {target.config.hidden_size}")
    if not heads.own_lm_head:
        heads.attach_lm_head(target.get_output_embeddings())
    heads.attach_embedding(target.get_input_embeddings())
    heads.draft_vocab = read_draft_vocab(folder)
    return heads.to(target.device, target.dtype).eval().requires_grad_(False)


def save_hydra_heads(heads: HydraHeads, folder: str | Path, dtype: torch.dtype | None = None, **config) -> Path:
    """Write ``config.json`` + ``hydra_heads.safetensors`` (+ the draft vocabulary)."""
    return save_head_stack(heads, folder, WEIGHT_FILE, dtype, **config)


FAMILY = Family("hydra_head", load_hydra_heads, save_hydra_heads, files=(WEIGHT_FILE,),
                fixture="tests.zoo_fixtures:write_hydra_head",
                doc="Hydra heads (local folder, this module's format) for method=hydra")
