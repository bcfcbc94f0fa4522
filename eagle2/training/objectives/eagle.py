"""The EAGLE head objective (``train_head.py stage=head``, settings ``train.head``; the EAGLE paper's loss).

For every sequence the head reads the pairs ``(t[i+1], f[i])``, with ``f[i]`` jittered by uniform noise
``U(-noise, noise)``, under causal attention; its output ``p[i]`` is regressed onto ``f[i+1]`` with SmoothL1 and,
weighted by ``w_cls``, its distribution ``log_softmax(lm_head(p[i]))`` is fitted to the target's
``softmax(lm_head(f[i+1]))`` (soft cross-entropy, over the drafting vocabulary with ``cls_vocab_size``).
Losses count only where ``f[i+1]`` is an answer position; the prompt is context. The embedding and LM head are
the target's, frozen. ``unroll > 1`` adds draft steps on the head's own predicted features, attending as
drafting does (``losses.unrolled_predictions``). The export is the published format without the embedding.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from eagle2.heads.eagle_head import FAMILY, EagleHead, head_config_from_target, load_head
from eagle2.training.data import Sequence, tokens_by_frequency
from eagle2.training.evaluation.agreement import ranked_ids
from eagle2.training.evaluation.evaluate import evaluate_drafter, feature_chain
from eagle2.training.evaluation.heldout import validation
from eagle2.training.objectives import Member, Objective, exported, train_objective
from eagle2.training.support.losses import (
    LossProjection,
    answer_positions,
    combine,
    loss_dtype,
    soft_cross_entropy,
    subsample,
    unrolled_predictions,
)
from eagle2.training.support.models import export
from eagle2.training.support.target_logits import target_logits


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


def head_loss(head: EagleHead, batch: dict, *, proj: LossProjection, noise: float, w_reg: float,
              w_cls: float, unroll: int = 1, unroll_cls_fraction: float = 1.0, top_k: int = 0, w_topk: float = 0.0,
              detach_unroll: bool = False, generator: torch.Generator | None = None, train: bool = True,
              with_stats: bool = True):
    """EAGLE loss over a batch; returns (loss, stats). Noise only when ``train``; agreement stats
    (top-1, and top-4 when not training) only ``with_stats``.

    ``unroll > 1`` adds the loss of draft steps 2..unroll (``unrolled_predictions``), each fitted to
    ``f[j+1]`` like step 1. The steps' losses are averaged; ``top1`` stays step 1's, ``top1_s{s}`` is
    step ``s``'s. The cross-entropy (the 49k-vocabulary LM head, most of the cost) of steps >= 2 may
    use a random ``unroll_cls_fraction`` of their positions when training: an unbiased estimate at a
    fraction of the cost. HASS (``objectives.hass``): ``w_topk`` times the top-``top_k`` distillation loss is
    added (in the cross-entropy's pass, ``losses.top_k_target``; training only) and ``detach_unroll`` feeds each
    step its predecessor's prediction without its gradient."""
    if w_topk and not w_cls:
        raise ValueError("w_topk needs w_cls > 0 (the top-k loss rides on the cross-entropy's pass)")
    proj = proj if train else proj.exact()
    feats = batch["features"]
    f_in = feats[:, :-1]
    if train and noise > 0:
        jitter = torch.rand(f_in.shape, generator=generator, device=f_in.device, dtype=f_in.dtype)
        f_in = f_in + (jitter * 2 - 1) * noise
    losses, stats = [], {}
    topk = {"top_k": top_k, "top_k_weight": w_topk / w_cls} if w_topk and train else {}
    target = target_logits(batch)  # each position's target distribution once, over the steps (and a joint run)
    for step, pred, sel in unrolled_predictions(head, batch["tokens"], f_in, answer_positions(batch), unroll,
                                                detach_unroll):
        n = int(sel.sum())
        if n == 0:
            continue
        p, y, at = pred[sel], feats[:, step:][sel], target.positions(step)[sel]
        reg = F.smooth_l1_loss(p, y)
        pick = subsample(n, unroll_cls_fraction, generator, p.device) if step > 1 and train else None
        p_cls, at = (p, at) if pick is None else (p[pick], at[pick])
        cls, step_stats = soft_cross_entropy(p_cls, lambda a, b, at=at: target(proj, at[a:b]), proj,
                                             topk=(1 if train else 4) if with_stats else 0, **topk)
        losses.append(w_reg * reg + w_cls * cls)
        if step == 1:
            step_stats.pop("entropy", None)
            stats.update(step_stats, reg=reg.item(), cls=cls.item(), n=n)
        elif "top1" in step_stats:
            stats.update({f"top1_s{step}": step_stats["top1"], f"n_s{step}": step_stats["n"]})
    return combine(losses, stats, feats)


def head_setup(target, cfg, cls_vocab: torch.Tensor | None = None) -> tuple[EagleHead, object, dict]:
    """(fresh or continued EAGLE head, its loss function, its fingerprint settings) for ``cfg``; the soft
    cross-entropy runs over ``cls_vocab`` (None: the full vocabulary)."""
    head = new_head(target, cfg.init_from_target, cfg.num_layers)
    if cfg.init_from:  # continue from a trained head (published format); its draft vocabulary too
        start = load_head(cfg.init_from, target)
        head.load_state_dict(start.state_dict(), strict=False)
        head.draft_vocab = start.draft_vocab
    if cls_vocab is not None:  # it drafts over the vocabulary it was trained over
        head.draft_vocab = cls_vocab.clone()
    proj = LossProjection(target.get_output_embeddings(), loss_dtype(cfg.loss_dtype), cls_vocab)
    unroll = int(cfg.unroll)
    hass = {"top_k": int(cfg.get("top_k") or 0), "w_topk": float(cfg.get("w_topk") or 0.0),
            "detach_unroll": bool(cfg.get("detach_unroll", False))}  # HASS's settings (objectives.hass)
    loss_fn = partial(head_loss, proj=proj, noise=cfg.noise, w_reg=cfg.w_reg, w_cls=cfg.w_cls, unroll=unroll,
                      unroll_cls_fraction=float(cfg.unroll_cls_fraction), **hass)
    # (the unroll and HASS settings are in the fingerprint only when on: older checkpoints still resume)
    extra = {} if unroll == 1 else {"unroll": unroll, "unroll_cls_fraction": float(cfg.unroll_cls_fraction)}
    extra |= {k: v for k, v in hass.items() if v and (k != "top_k" or hass["w_topk"])}
    if cls_vocab is not None:
        extra["cls_vocab_size"] = len(cls_vocab)
    return head, loss_fn, extra


def cls_vocab(corpus_dir, cfg) -> torch.Tensor | None:
    """The token ids the soft cross-entropy runs over (``cfg.cls_vocab_size`` most frequent answer tokens,
    the head's drafting vocabulary); None: the full vocabulary."""
    size = cfg.get("cls_vocab_size")
    return tokens_by_frequency(corpus_dir, limit=int(size)) if size else None


def eagle_setup(target, corpus_dir: str | Path, cfg) -> tuple[EagleHead, object, dict]:
    """``head_setup`` with the drafting vocabulary of ``cfg`` over ``corpus_dir`` (``cls_vocab``)."""
    return head_setup(target, cfg, cls_vocab(corpus_dir, cfg))


def train_head(target, corpus_dir: str | Path, cfg, out_dir: str | Path, **kwargs) -> tuple[EagleHead, dict]:
    """Train an EAGLE head on ``corpus_dir``; checkpoints and metrics go to ``out_dir``; ``kwargs`` go to
    ``objectives.train_objective`` (``val_seqs``) and ``loop.fit``."""
    torch.manual_seed(cfg.seed)
    head, loss_fn, extra = eagle_setup(target, corpus_dir, cfg)
    return train_objective(head, loss_fn, target, corpus_dir, cfg, out_dir, desc="head", fingerprint_extra=extra,
                           **kwargs)


def head_chain(head, proj: LossProjection, seq: Sequence, anchors: list[int], depth: int) -> torch.Tensor:
    """(A, depth) tokens drafted greedily by an EAGLE head (through the target's LM head ``proj``)."""
    return feature_chain(head, seq.features, lambda f: ranked_ids(proj(f), 1)[:, 0], seq, anchors, depth)


def head_chain_of(head, target):
    """The head's greedy chain drafter (``evaluate.chain_acceptance``), through the target's fp32 LM head."""
    return partial(head_chain, head, LossProjection(target.get_output_embeddings(), torch.float32))


def evaluate_head(head, target, seqs: list[Sequence], cfg) -> dict:
    """Teacher-forced top-1/top-4 and greedy-chain acceptance of an EAGLE head on ``seqs``."""
    proj = LossProjection(target.get_output_embeddings(), torch.float32)
    return evaluate_drafter(head, seqs, cfg, partial(head_loss, proj=proj, noise=0.0, w_reg=1.0, w_cls=0.1),
                            head_chain_of(head, target))


def export_head(head, summary: dict, cfg, root: Path, section: str = "head", *, family=FAMILY,
                export_key: str = "head") -> Path:
    """Store a trained EAGLE head (published format, no embedding) at ``train.export.<export_key>`` (a HASS head:
    ``hass_head``, its ``family``) with its card."""
    if head.draft_vocab is None:  # a head continued from another keeps that head's vocabulary
        head.draft_vocab = tokens_by_frequency(root / cfg.train.corpus.out_dir)
    return export(head, family, summary, cfg, root, kind="head", export_key=export_key, section=section)


def head_stage(target, tokenizer, cfg, root: Path) -> Path | None:
    """Train the EAGLE head (resuming) and export it to ``train.export.head``."""
    c = cfg.train.head
    head, summary = train_head(target, root / cfg.train.corpus.out_dir, c, root / c.out_dir, stop_after=c.stop_after,
                               **validation(target, tokenizer, cfg, root, "head", head_chain_of))
    return export_head(head, summary, cfg, root) if exported(summary) else None


OBJECTIVE = Objective("head", "head", head_stage, order=1, export_key="head", family=FAMILY, evaluate=evaluate_head,
                      member=Member(eagle_setup, export_head, head_chain_of), weights=("init_from",))
