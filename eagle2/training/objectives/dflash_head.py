"""The DFlash objective (``train_head.py stage=dflash_head``, settings ``train.dflash_head``), as the paper trains.

Per sequence, up to ``num_anchors`` anchor positions are drawn at random among those whose next token is an answer
token; each anchor ``a`` opens one block: the token ``t[a]`` then ``block_size`` - 1 mask tokens at positions a ..
a + block_size - 1. All blocks of a row run in ONE forward (``block_layout``): every block sees the row's context
features strictly before its anchor (the target's feature at ``a`` is not known when ``t[a]`` is the last committed
token) and its own block, bidirectionally; blocks never see each other. Slot k is trained with cross-entropy on the
token ``t[a+k]`` (a hard label: the corpus of the target's own answers makes it the target's token), counted when
that token is an answer token, weighted ``exp(-(k-1) / loss_decay_gamma)`` (earlier slots matter more: a draft is
accepted up to its first miss; the paper's gamma 7 for blocks of 16, 5 for 10, 4 for 8). The target's embedding
and LM head are read, never trained.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from eagle2.core.tree import additive_mask
from eagle2.heads.dflash_head import FAMILY, DFlashHead, default_taps, dflash_config_from_target
from eagle2.training.evaluation.evaluate import evaluate_drafter
from eagle2.training.objectives import Member, Objective, module_chain, solo_stage
from eagle2.training.support.losses import answer_positions, combine
from eagle2.training.support.models import export


def block_anchors(answer: torch.Tensor, count: int, generator: torch.Generator | None) -> torch.Tensor:
    """Up to ``count`` anchors of a row, ascending, drawn at random among the positions ``a`` whose next token
    counts (``answer[a]``, ``answer`` (L-1,): position j counts when token j + 1 is an answer token)."""
    candidates = answer.nonzero()[:, 0]
    if len(candidates) > count:
        pick = torch.randperm(len(candidates), generator=generator)[:count].to(candidates.device)
        candidates = candidates[pick.sort().values]
    return candidates


def block_layout(length: int, anchors: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions (length + N*bs,), allowed (N*bs, length + N*bs) bool) of one row's forward: ``length`` context
    positions then N blocks. A block's slot sees the context before its anchor and its whole own block."""
    device = anchors.device
    anchor = anchors.repeat_interleave(block_size)  # (Q,)
    block = torch.arange(len(anchors), device=device).repeat_interleave(block_size)
    slot = torch.arange(block_size, device=device).repeat(len(anchors))
    before = torch.arange(length, device=device)[None, :] < anchor[:, None]
    own = block[None, :] == block[:, None]
    return torch.cat([torch.arange(length, device=device), anchor + slot]), torch.cat([before, own], dim=1)


def block_forward(head: DFlashHead, tokens: torch.Tensor, taps: torch.Tensor, anchors: torch.Tensor,
                  block_size: int | None = None) -> torch.Tensor:
    """The blocks opened at ``anchors`` of a row (``tokens`` (L,), ``taps`` (L, k*H)) in one forward: (N, bs, h)."""
    bs = block_size or head.block_size
    ids = torch.full((len(anchors), bs), head.mask_token_id, dtype=torch.long, device=tokens.device)
    ids[:, 0] = tokens[anchors]
    positions, allowed = block_layout(len(tokens), anchors, bs)
    out = head(ids.view(1, -1), taps[None], position_ids=positions[None],
               attention_mask=additive_mask(allowed, taps.dtype, taps.device))
    return out[0].view(len(anchors), bs, -1)


def slot_weights(block_size: int, gamma: float | None, device) -> torch.Tensor:
    """(bs - 1,) the weight of slots 1..bs-1: exp(-(k-1)/gamma), or 1 (gamma null or 0)."""
    k = torch.arange(1, block_size, device=device, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma) if gamma else torch.ones_like(k)


def dflash_loss(head: DFlashHead, batch: dict, *, num_anchors: int = 64, gamma: float | None = 4.0,
                generator: torch.Generator | None = None, train: bool = True, with_stats: bool = True):
    """The DFlash loss over a batch (module docstring); outside training the anchor draw is seeded (0)."""
    if "layer_features" not in batch:
        raise ValueError("a DFlash draft model trains on a corpus with layer_features (train.corpus.tap_layers=eagle3)")
    generator = generator if train else torch.Generator().manual_seed(0)
    bs, answer, feats = head.block_size, answer_positions(batch), batch["layer_features"]
    logits, labels, counted = [], [], []
    for row in range(batch["tokens"].shape[0]):
        tokens, n_pos = batch["tokens"][row], answer.shape[1]
        anchors = block_anchors(answer[row], num_anchors, generator)
        if len(anchors) == 0:
            continue
        out = block_forward(head, tokens, feats[row].to(head.fc.weight.dtype), anchors)  # (N, bs, h)
        at = anchors[:, None] + torch.arange(1, bs, device=anchors.device)  # (N, bs-1): the labels' positions
        inside = at <= n_pos
        logits.append(head.logits(out[:, 1:]))
        labels.append(tokens[at.clamp(max=n_pos)])
        counted.append(inside & answer[row][(at - 1).clamp(max=n_pos - 1)])
    if not logits:
        return combine([], {}, feats)
    logits, labels, counted = torch.cat(logits), torch.cat(labels), torch.cat(counted)  # (A, bs-1, ...)
    ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape)
    weight = slot_weights(bs, gamma, ce.device)[None] * counted
    loss = (ce * weight).sum() / weight.sum().clamp(min=1e-6)
    stats = {"cls": loss.item(), "n": int(counted[:, 0].sum())}
    if with_stats:
        with torch.no_grad():
            hit = (logits.argmax(-1) == labels) & counted
            for k in range(bs - 1):
                n = int(counted[:, k].sum())
                top1 = float(hit[:, k].sum()) / max(1, n)
                stats.update({"top1": top1} if k == 0 else {f"top1_s{k + 1}": top1, f"n_s{k + 1}": n})
    return combine([loss], stats, feats)


def new_dflash_head(target, layers: int, block_size: int, taps=None) -> DFlashHead:
    """A fresh fp32 DFlash draft model for ``target``: random layers and ``fc``, its ``norm`` started from the
    target's final norm (its outputs then read through the target's LM head as the target's own do)."""
    config = dflash_config_from_target(target.config, layers=layers, block_size=block_size)
    head = DFlashHead(config, tuple(taps) if taps else default_taps(target.config.num_hidden_layers))
    with torch.no_grad():
        head.norm.weight.copy_(target.base_model.norm.weight)
    return head.attach_target(target).to(target.device, torch.float32)


def dflash_setup(target, corpus_dir: str | Path, cfg):
    """(fresh DFlash draft model, its loss function, its fingerprint settings) for ``cfg``."""
    head = new_dflash_head(target, int(cfg.layers), int(cfg.block_size), cfg.get("taps"))
    gamma = cfg.get("loss_decay_gamma")
    gamma = None if gamma is None else float(gamma)
    extra = {"type": "dflash", "layers": int(cfg.layers), "block_size": head.block_size,
             "num_anchors": int(cfg.num_anchors), "loss_decay_gamma": gamma, "taps": list(head.feature_layers)}
    return head, partial(dflash_loss, num_anchors=int(cfg.num_anchors), gamma=gamma), extra


def dflash_chain(head: DFlashHead, seq, anchors: list[int], depth: int) -> torch.Tensor:
    """(A, depth) tokens the draft model drafts in one forward after each anchor ``a`` of ``chain_acceptance``
    (context up to ``t[a+1]``: a block opened at a + 1), each slot's argmax; ``depth`` < its block size."""
    device = head.fc.weight.device
    tokens, taps = seq.tokens.to(device), seq.layer_features.to(device, head.fc.weight.dtype)
    depth = min(depth, head.block_size - 1)
    out = block_forward(head, tokens, taps, torch.tensor(anchors, device=device) + 1, depth + 1)
    return head.logits(out[:, 1:]).argmax(-1)


def evaluate_dflash_head(head, target, seqs, cfg) -> dict:
    """Held-out top-1 per slot (the seeded anchor draw) and the one-forward chain's acceptance."""
    return evaluate_drafter(head, seqs, cfg, partial(dflash_loss, num_anchors=64), partial(dflash_chain, head))


def export_dflash(head, summary: dict, cfg, root: Path, section: str = "dflash_head") -> Path:
    """Store a trained DFlash draft model at ``train.export.dflash_head`` with its card."""
    return export(head, FAMILY, summary, cfg, root, kind="dflash", export_key="dflash_head", section=section)


MEMBER = Member(dflash_setup, export_dflash, module_chain(dflash_chain))
OBJECTIVE = Objective("dflash_head", "DFlash draft model", solo_stage("dflash_head", "dflash", MEMBER),
                      export_key="dflash_head", family=FAMILY, evaluate=evaluate_dflash_head, member=MEMBER)
