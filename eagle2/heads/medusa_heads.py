"""Medusa-1 heads (Cai et al., 2024) on the target's last hidden state, and their published format.

Head k (k = 0..K-1) reads the target's post-norm last hidden state ``f[t]`` (the tensor its LM head
multiplies, which predicts token t+1) and predicts token t+k+2: L residual blocks
``x + SiLU(W x + b)`` and then an LM head. In the Medusa-1 checkpoints each head has its own LM head
(initialised from the target's); a head may instead share the target's frozen LM head (what the
authors' later "version 2" heads do, and what the SmolLM2 head here does: a 49k x 576 LM head per
head would be 28M parameters).

Published format (FasterDecoding/medusa-vicuna-7b-v1.3, read from the authors' ``medusa_model.py``):
a folder (local or a hub id) with ``config.json`` (``medusa_num_heads``, ``medusa_num_layers``,
``base_model_name_or_path``) and ``medusa_lm_head.pt``: the state dict of an ``nn.ModuleList`` of
``nn.Sequential(ResBlock x L, Linear(H, V, bias=False))``, i.e. keys ``{k}.{l}.linear.weight`` [H, H],
``{k}.{l}.linear.bias`` [H] and ``{k}.{L}.weight`` [V, H]. The number of heads is read from the
weights: the vicuna-7b/13b-v1.3 configs say 2 while their files hold 5 heads (the authors' loader
uses ``strict=False``). ``.pt``/``.bin`` files are read with ``torch.load(weights_only=True)`` (never
running pickled code), ``medusa_lm_head.safetensors`` when present; loading is strict and names a
bad key. We save ``config.json`` + ``medusa_lm_head.safetensors`` with the same keys, without the
``{k}.{L}.weight`` keys when the LM head is shared (``"shared_lm_head": true`` in the config).

Extension (as the EAGLE head's): ``draft_vocab.safetensors`` (``token_ids``) makes the heads' softmax
run over those tokens only: they were trained over them (a CPU saving: 8k of SmolLM2's 49k rows), and
a token outside is never drafted, which caps acceptance but never changes the output.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import torch
from torch import nn

from eagle2.heads.checkpoint import (
    check_state,
    checkpoint_folder,
    read_token_ids,
    read_weights,
    write_checkpoint,
    write_token_ids,
)
from eagle2.heads.family import Family

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
DRAFT_VOCAB_FILE = "draft_vocab.safetensors"  # our extension, as the EAGLE head's
WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt", "medusa_lm_head.bin")
_KEY = re.compile(r"^(\d+)\.(\d+)\.")

# The Medusa authors' default tree for 7B models (medusa/model/medusa_choices.py): 63 nodes, depth 4.
# Path [i, j] = the i-th most likely token of head 0, then the j-th of head 1.
MC_SIM_7B_63 = [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0],
                [0, 5], [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0],
                [0, 9], [8], [9], [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5],
                [0, 0, 0, 0], [0, 1, 1], [0, 0, 6], [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9],
                [6, 0], [0, 4, 0], [1, 4], [7, 0], [0, 1, 2], [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0],
                [1, 5], [1, 0, 1], [0, 2, 1], [9, 0], [0, 6, 0], [0, 0, 0, 1], [1, 6], [0, 7, 0]]


class ResBlock(nn.Module):
    """``x + SiLU(linear(x))``; the weight starts at zero (the identity up to the bias), as Medusa's."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class HeadStack(nn.ModuleList):
    """K heads, each an ``nn.Sequential`` of ``num_layers`` blocks and optionally its own LM head (its
    last entry); without one, every head ends in the target's LM head (``attach_lm_head``, kept out of
    the state dict). What Medusa and Hydra heads share: the LM head per head, the draft vocabulary, and
    the per-head entry points that training, evaluation and drafting call (``head_features``,
    ``path_logits``); ``path`` (..., k+1) holds the tokens after the anchor (the root first), which only
    heads that ``reads_path`` look at."""

    reads_path = False

    def __init__(self, heads, num_layers: int, hidden: int, vocab_size: int | None):
        if vocab_size is not None:
            for b in heads:
                b.append(nn.Linear(hidden, vocab_size, bias=False))
        super().__init__(nn.Sequential(*b) for b in heads)
        self.num_layers, self.hidden, self.vocab_size = num_layers, hidden, vocab_size
        self._shared: list[nn.Module] = []  # the target's LM head when shared
        self.draft_vocab: torch.Tensor | None = None  # token ids the heads' softmax runs over (None: all)

    @property
    def own_lm_head(self) -> bool:
        return self.vocab_size is not None

    def attach_lm_head(self, lm_head: nn.Module) -> "HeadStack":
        self._shared = [lm_head]
        return self

    def lm_head(self, k: int) -> nn.Module:
        """The LM head that head ``k`` ends in: its own, or the shared target's."""
        if self.own_lm_head:
            return self[k][self.num_layers]
        if not self._shared:
            raise RuntimeError(f"{type(self).__name__} share the target's LM head: call attach_lm_head(target.lm_head)")
        return self._shared[0]

    def head_features(self, k: int, hidden: torch.Tensor, path: torch.Tensor | None = None) -> torch.Tensor:
        """(..., H): head ``k``'s blocks on hidden states (..., H) (and, for heads that read it, ``path``)."""
        raise NotImplementedError

    def head_logits(self, k: int, feats: torch.Tensor) -> torch.Tensor:
        """(..., V'): head ``k``'s LM head on its features, over the draft vocabulary (column i is token
        ``draft_vocab[i]``) when there is one."""
        rows = slice(None) if self.draft_vocab is None else self.draft_vocab.to(feats.device)
        return nn.functional.linear(feats, self.lm_head(k).weight[rows])

    def path_logits(self, hidden: torch.Tensor, path: torch.Tensor | None = None) -> torch.Tensor:
        """(K, ..., V') every head's logits at hidden states (..., H) whose true continuation is ``path``
        (..., K) (teacher forcing: what drafting reads when the path so far is right)."""
        return torch.stack([self.head_logits(k, self.head_features(k, hidden, None if path is None else
                                                                   path[..., : k + 1]))
                            for k in range(len(self))])


class MedusaHeads(HeadStack):
    """K Medusa heads; a ModuleList so that the state-dict keys are the published ones (``0.0.linear.weight``).

    ``vocab_size`` set: each head ends in its own LM head. None: the heads output features for the
    target's LM head (``attach_lm_head``), kept out of the state dict."""

    def __init__(self, num_heads: int, num_layers: int, hidden: int, vocab_size: int | None = None):
        super().__init__([[ResBlock(hidden) for _ in range(num_layers)] for _ in range(num_heads)], num_layers,
                         hidden, vocab_size)

    def features(self, hidden: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """(K', ..., H): the residual blocks' output of the first ``heads`` heads (all by default)."""
        return torch.stack([head[: self.num_layers](hidden) for head in list(self)[: heads or len(self)]])

    def head_features(self, k: int, hidden: torch.Tensor, path: torch.Tensor | None = None) -> torch.Tensor:
        return self[k][: self.num_layers](hidden)  # Medusa heads never read the path

    def forward(self, hidden: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """(K', ..., V') logits of the first ``heads`` heads for hidden states (..., H), over the draft
        vocabulary (column i is token ``draft_vocab[i]``) when there is one."""
        return torch.stack([self.head_logits(k, f) for k, f in enumerate(self.features(hidden, heads))])

    def config(self, **extra) -> dict:
        return {"medusa_num_heads": len(self), "medusa_num_layers": self.num_layers, "hidden_size": self.hidden,
                "shared_lm_head": not self.own_lm_head, **extra}


# ------------------------------------------------------------------------------------ format

def heads_from_state(state: dict[str, torch.Tensor], config: dict, what: str) -> MedusaHeads:
    """Empty heads shaped as ``state`` says (head count from the keys, layers from the config), checked
    strictly against it: a key outside the format, a missing key or a wrong shape raises naming it."""
    bad = sorted(k for k in state if not _KEY.match(k))
    if bad:
        raise KeyError(f"{what}: unexpected keys {bad} (Medusa keys are '<head>.<layer>.…')")
    num_heads = 1 + max(int(_KEY.match(k).group(1)) for k in state)
    layers = int(config.get("medusa_num_layers", 1))
    if config.get("medusa_num_heads") not in (None, num_heads):
        log.warning("%s: config.json says %s heads, the weights hold %d: using %d", what,
                    config["medusa_num_heads"], num_heads, num_heads)
    lm = state.get(f"0.{layers}.weight")
    first_key = "0.0.linear.weight" if layers else f"0.{layers}.weight"
    if first_key not in state:
        raise KeyError(f"{what}: missing key {first_key!r}")
    heads = MedusaHeads(num_heads, layers, state[first_key].shape[1], None if lm is None else lm.shape[0])
    check_state(what, state, heads.state_dict())
    heads.load_state_dict(state)
    return heads


def load_medusa_heads(location: str | Path, target) -> MedusaHeads:
    """Load heads in the published format, strictly, on the target's device and dtype; heads without
    their own LM head get the target's."""
    folder = checkpoint_folder(str(location), "Medusa heads", "model.medusa_head",
                               (CONFIG_FILE, DRAFT_VOCAB_FILE, *WEIGHT_FILES))
    config = json.loads((folder / CONFIG_FILE).read_text()) if (folder / CONFIG_FILE).is_file() else {}
    heads = heads_from_state(read_weights(folder, WEIGHT_FILES), config, f"Medusa heads {folder}")
    hidden = target.config.hidden_size
    if heads.hidden != hidden:
        raise ValueError(f"Medusa heads {folder} have width {heads.hidden}, the target {hidden}")
    if not heads.own_lm_head:
        heads.attach_lm_head(target.get_output_embeddings())
    heads.draft_vocab = read_draft_vocab(folder)
    return heads.to(target.device, target.dtype).eval().requires_grad_(False)


def save_head_stack(heads: HeadStack, folder: str | Path, weight_file: str, dtype: torch.dtype | None = None,
                    **config) -> Path:
    """Write ``config.json`` + ``weight_file`` (the heads' state, in ``dtype``) + the draft vocabulary."""
    folder = write_checkpoint(folder, heads.config(**config), heads.state_dict(), dtype, weight_file)
    write_draft_vocab(heads.draft_vocab, folder)
    return folder


def save_medusa_heads(heads: MedusaHeads, folder: str | Path, dtype: torch.dtype | None = None, **config) -> Path:
    """Write ``config.json`` + ``medusa_lm_head.safetensors`` (the published keys)."""
    return save_head_stack(heads, folder, WEIGHT_FILES[0], dtype, **config)


def read_draft_vocab(folder: Path) -> torch.Tensor | None:
    """The token ids of ``draft_vocab.safetensors`` in ``folder`` (None when there is none)."""
    path = folder / DRAFT_VOCAB_FILE
    return read_token_ids(path) if path.is_file() else None


def write_draft_vocab(token_ids: torch.Tensor | None, folder: Path) -> None:
    if token_ids is not None:
        write_token_ids(token_ids, folder / DRAFT_VOCAB_FILE)


FAMILY = Family("medusa_head", load_medusa_heads, save_medusa_heads, files=WEIGHT_FILES,
                fixture="tests.zoo_fixtures:write_medusa_head",
                doc="Medusa heads (hub id or local folder, the authors' medusa_lm_head format) for method=medusa")
