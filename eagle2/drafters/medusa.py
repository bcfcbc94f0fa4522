"""Medusa-1: K heads on the target's last hidden state propose a static tree of top-k choices.

The hidden state of the last committed token (the one whose LM-head output is the root) goes through
every head once per round: head d-1 gives the candidates at depth d. A node's path [r1, ..., rd] is the
r1-th most likely token of head 0, then the r2-th of head 1, and so on (the authors' "medusa choices";
default tree ``eagle2.heads.medusa_heads.MC_SIM_7B_63``). Candidates are chosen deterministically (top-k), so at
temperature > 0 they are verified by the lossless rule for deterministically chosen children
(``eagle2.core.accept``), not by Medusa's typical acceptance, which changes the output distribution.
``ChoiceTreeDrafter`` (the tree of ranked choices, its records and its cut to the room left) is shared
with Hydra (``eagle2.drafters.hydra``), whose heads also read the path.
"""

from __future__ import annotations

import torch

from eagle2.core.clock import Spans
from eagle2.core.tree import DraftTree, choice_paths
from eagle2.drafters.eagle_common import drafting_lm_head, path_log_values, tree_from_drafted
from eagle2.heads.compiled_stack import blocks
from eagle2.heads.medusa_heads import HeadStack


class ChoiceTreeDrafter:
    """A static tree of ranked choices on the last committed hidden state (Medusa's and Hydra's): node
    ``[r1, ..., rd]`` is the rd-th most likely child its head gives its parent. Subclasses say how the
    nodes' tokens come about (``node_candidates``)."""

    needs_hidden = True

    def __init__(self, heads: HeadStack, device, *, choices, lm_head_dtype: torch.dtype | None = None):
        self.heads, self.device = heads, device
        self.paths = choice_paths(choices)
        index = {p: i for i, p in enumerate(self.paths)}
        self.parent = torch.tensor([index[p[:-1]] if len(p) > 1 else -1 for p in self.paths])
        self.depth = torch.tensor([len(p) for p in self.paths])
        self.rank = torch.tensor([p[-1] for p in self.paths])
        self.num_heads = int(self.depth.max())
        if self.num_heads > len(heads):
            raise ValueError(f"method.choices is {self.num_heads} deep but the heads are {len(heads)}")
        self.top_k = int(self.rank.max()) + 1
        dtype = None if heads.own_lm_head else lm_head_dtype  # a head's own LM head stays as it is
        self.lm_heads = [drafting_lm_head(heads.lm_head(k), dtype, heads.draft_vocab) for k in range(self.num_heads)]
        self.vocab = heads.draft_vocab  # column i of the drafting logits is token vocab[i]
        self.spans = Spans(device)  # its own forwards, read after the generation

    def start(self, prompt_ids, first_token, prompt_hidden) -> None:
        self.spans.clear()
        self.hidden = prompt_hidden[-1]

    def observe(self, new_tokens, hidden) -> None:
        self.hidden = hidden[-1]

    def node_candidates(self, root: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(N,) token ids and (N,) log-confidences of the tree's nodes, in ``self.paths`` order."""
        raise NotImplementedError

    def propose(self, root: int, room: int) -> DraftTree:
        node_tokens, log_conf = self.node_candidates(root)
        keep = torch.arange(min(len(self.paths), max(room - 1, 0)))
        return tree_from_drafted(root, node_tokens, self.parent, self.depth, self.rank, log_conf,
                                 path_log_values(self.parent, log_conf), keep)


class MedusaDrafter(ChoiceTreeDrafter):
    """Medusa: every head reads the same hidden state, so a node's token depends only on its depth and rank."""

    def candidates(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(depth, top_k) token ids and log-probabilities of the top choices of each head, best first."""
        with self.spans.span():
            feats = blocks(self.heads).features(self.hidden.to(next(self.heads.parameters()).dtype), self.num_heads)
            logits = torch.stack([lm(f.to(lm.weight.dtype)) for lm, f in zip(self.lm_heads, feats)]).float()
            top = torch.topk(torch.log_softmax(logits, dim=-1), self.top_k, dim=-1)
        tokens = top.indices.cpu()
        return (tokens if self.vocab is None else self.vocab[tokens]), top.values.cpu()

    def node_candidates(self, root: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, log_probs = self.candidates()
        return tokens[self.depth - 1, self.rank], log_probs[self.depth - 1, self.rank]


def build(method_cfg, target, params, generator, weights: dict) -> MedusaDrafter:
    from eagle2.core.precision import resolve_dtype

    dtype = method_cfg.get("draft_lm_head_dtype")
    return MedusaDrafter(weights["medusa_head"], target.device, choices=list(method_cfg.choices),
                         lm_head_dtype=resolve_dtype(dtype) if dtype else None)
