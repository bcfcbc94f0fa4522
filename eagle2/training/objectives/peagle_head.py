"""The P-EAGLE head objective (``train_head.py stage=peagle_head``, settings ``train.peagle_head``).

One head forward per batch row covers every depth (``parallel_layout``): the row's positions as EAGLE-3 reads
them (depth 1: token ``t[a+1]``, tapped features ``g[a]``, causal) and, for anchors ``a`` kept at depth d >= 2, a
mask slot at position a + d - 1 (the mask token, ``mask_hidden``) that sees the positions up to ``a`` and its own
anchor's earlier slots, as drafting does (``eagle2.drafters.peagle``). Conditional drop-token (COD) sampling keeps
it small: depth 1 keeps every answer position, depth d a random ``max(ratio ** (d-1), floor)`` share of them
(speculators' P-EAGLE: 0.7 and 0.2), drawn from the anchors kept at depth d - 1 (a slot needs its predecessors).
Loss: KL(target || draft) over the draft vocabulary (as a soft cross-entropy: the same gradient) at every kept
element, count-normalised, no per-depth decay. Stats: top-1 agreement per depth (``top1``, ``top1_s{d}``).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from eagle2.heads.peagle_head import FAMILY, PEagleHead, peagle_config_from_target
from eagle2.training.evaluation.agreement import agreement, ranked_ids
from eagle2.training.evaluation.evaluate import evaluate_drafter
from eagle2.training.objectives import Member, Objective, module_chain, solo_stage
from eagle2.training.objectives.eagle3 import draft_vocabulary_ids, new_eagle3_head
from eagle2.training.support.losses import LogitsSoftCrossEntropy, LossProjection, answer_positions, combine, loss_dtype
from eagle2.training.support.models import export
from eagle2.training.support.target_logits import target_logits


def cod_anchors(answer: torch.Tensor, depths: int, ratio: float, floor: float,
                generator: torch.Generator | None) -> list[torch.Tensor]:
    """Anchors kept at depths 2..``depths`` (one tensor each) of a row whose head position j counts when
    ``answer[j]``: at depth d about ``n * max(ratio ** (d-1), floor)`` (n: the answer positions), drawn from
    those kept at depth d - 1 whose depth-d target counts. ``ratio`` 1: every anchor that can be."""
    n_pos, n = answer.shape[0], int(answer.sum())
    kept, out = answer.nonzero()[:, 0], []
    for d in range(2, depths + 1):
        reach = kept[kept + d - 1 < n_pos]
        kept = reach[answer[reach + d - 1]]
        want = min(len(kept), max(1, round(n * max(ratio ** (d - 1), floor))))
        if want < len(kept):
            pick = torch.randperm(len(kept), generator=generator)[:want].to(kept.device)
            kept = kept[pick.sort().values]
        out.append(kept)
    return out


def parallel_layout(n_pos: int, deeper: list[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(anchor, depth (from 1), allowed (Q, Q) bool) of the elements of one head forward: the ``n_pos`` positions
    at depth 1, then each depth's slots (``deeper[d-2]``: their anchors). An element sees the depth-1 positions up
    to its anchor and its own anchor's slots up to its depth."""
    anchor = torch.cat([torch.arange(n_pos, device=device), *[a.to(device) for a in deeper]])
    depth = torch.cat([torch.ones(n_pos, dtype=torch.long, device=device),
                       *[torch.full((len(a),), d, device=device) for d, a in enumerate(deeper, start=2)]])
    same_row = (depth[None, :] == 1) & (anchor[None, :] <= anchor[:, None])
    own_slots = (depth[None, :] > 1) & (anchor[None, :] == anchor[:, None]) & (depth[None, :] <= depth[:, None])
    return anchor, depth, same_row | own_slots


def parallel_forward(head: PEagleHead, tokens: torch.Tensor, taps: torch.Tensor, deeper: list[torch.Tensor]):
    """One row's head forward over ``parallel_layout``: ``tokens`` (L,), ``taps`` (L, k*H) its tapped features.
    Returns (outputs (Q, h), anchor, depth)."""
    from eagle2.core.tree import additive_mask

    n_pos, device = tokens.shape[0] - 1, tokens.device
    anchor, depth, allowed = parallel_layout(n_pos, deeper, device)
    slots = int((depth > 1).sum())
    mask_tokens, mask_feats = head.mask_slots(slots, device)
    ids = torch.cat([tokens[1:], mask_tokens])
    feats = torch.cat([taps[:-1], mask_feats.to(taps.dtype)])
    out = head(ids[None], feats[None], position_ids=(anchor + depth - 1)[None],
               attention_mask=additive_mask(allowed, feats.dtype, device), cache=None)
    return out[0], anchor, depth


def peagle_loss(head, batch: dict, *, proj: LossProjection, ratio: float = 0.7, floor: float = 0.2,
                generator: torch.Generator | None = None, train: bool = True, with_stats: bool = True):
    """P-EAGLE loss over a batch (the module docstring); outside training the COD draw is seeded (0)."""
    proj = proj if train else proj.exact()
    if "layer_features" not in batch:
        raise ValueError("a P-EAGLE head trains on a corpus with layer_features (train.corpus.tap_layers=eagle3)")
    generator = generator if train else torch.Generator().manual_seed(0)
    ids, readout, feats = head.draft_token_ids(), head.drafting_lm_head(), batch["features"]
    answer, target = answer_positions(batch), target_logits(batch)
    preds, targets, depths = [], [], []
    for row in range(batch["tokens"].shape[0]):
        deeper = cod_anchors(answer[row], head.para_depths, ratio, floor, generator)
        out, anchor, depth = parallel_forward(head, batch["tokens"][row], batch["layer_features"][row], deeper)
        counted = answer[row][anchor + depth - 1]
        preds.append(out[counted])
        targets.append(target.positions()[row][(anchor + depth)[counted]])
        depths.append(depth[counted])
    p, y_at, depth = torch.cat(preds), torch.cat(targets), torch.cat(depths)
    if len(p) == 0:
        return combine([], {}, feats)
    logits = readout(p)
    q = torch.softmax(target(proj, y_at, ids), -1)
    ce = LogitsSoftCrossEntropy.apply(logits, q)
    stats = {"cls": ce.item(), "n": int((depth == 1).sum())}
    if with_stats:
        with torch.no_grad():
            for d in depth.unique().tolist():
                at = agreement(logits[depth == d].detach(), target(proj, y_at[depth == d]), ks=(1,), vocab_ids=ids)
                stats.update({"top1": at["top1"]} if d == 1 else {f"top1_s{d}": at["top1"], f"n_s{d}": at["n"]})
    return combine([ce], stats, feats)


def new_peagle_head(target, draft_ids: torch.Tensor, para_depths: int, taps=None) -> PEagleHead:
    """A fresh fp32 P-EAGLE head started as ``new_eagle3_head`` starts an EAGLE-3 head, ``mask_hidden`` zero."""
    start = new_eagle3_head(target, draft_ids, taps)
    config = peagle_config_from_target(target.config, start.draft_vocab_size, para_depths)
    head = PEagleHead(config, start.feature_layers)
    head.load_state_dict(start.state_dict(), strict=False)
    return head.attach_embedding(target.get_input_embeddings()).to(target.device, torch.float32)


def peagle_setup(target, corpus_dir: str | Path, cfg):
    """(fresh P-EAGLE head, its loss function, its fingerprint settings) for ``cfg``."""
    ids = draft_vocabulary_ids(corpus_dir, cfg.draft_vocab_size, target.config.vocab_size)
    head = new_peagle_head(target, ids, int(cfg.para_depths), cfg.get("taps"))
    proj = LossProjection(target.get_output_embeddings(), loss_dtype(cfg.loss_dtype))
    ratio, floor = float(cfg.down_sample_ratio), float(cfg.down_sample_ratio_min)
    extra = {"type": "peagle", "para_depths": head.para_depths, "down_sample_ratio": ratio,
             "down_sample_ratio_min": floor, "draft_vocab_size": head.draft_vocab_size}
    return head, partial(peagle_loss, proj=proj, ratio=ratio, floor=floor), extra


def peagle_chain(head, seq, anchors: list[int], depth: int) -> torch.Tensor:
    """(A, depth) tokens a P-EAGLE head drafts in one forward from each anchor (each depth's argmax)."""
    device = head.fc.weight.device
    tokens, taps = seq.tokens.to(device), seq.layer_features.to(device, head.fc.weight.dtype)
    at = torch.tensor(anchors, device=device)
    out, anchor, slot_depth = parallel_forward(head, tokens, taps, [at] * (depth - 1))
    rows = torch.cat([at, torch.arange(len(tokens) - 1, len(out), device=device)])
    drafted = ranked_ids(head.drafting_lm_head()(out[rows]), 1, head.draft_token_ids())[:, 0]
    return drafted.view(depth, len(anchors)).T


def evaluate_peagle_head(head, target, seqs, cfg) -> dict:
    """Held-out top-1 per depth (teacher-forced, the seeded COD draw) and the one-forward chain's acceptance."""
    proj = LossProjection(target.get_output_embeddings(), torch.float32)
    return evaluate_drafter(head, seqs, cfg, partial(peagle_loss, proj=proj), partial(peagle_chain, head))


def export_peagle(head, summary: dict, cfg, root: Path, section: str = "peagle_head") -> Path:
    """Store a trained P-EAGLE head at ``train.export.peagle_head`` with its card."""
    return export(head, FAMILY, summary, cfg, root, kind="peagle", export_key="peagle_head", section=section)


MEMBER = Member(peagle_setup, export_peagle, module_chain(peagle_chain))
OBJECTIVE = Objective("peagle_head", "P-EAGLE head", solo_stage("peagle_head", "peagle", MEMBER),
                      export_key="peagle_head", family=FAMILY, evaluate=evaluate_peagle_head, member=MEMBER)
