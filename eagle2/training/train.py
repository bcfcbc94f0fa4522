"""Training an EAGLE head or an SpS draft model on a self-distillation corpus, from its config section
(``train.head`` / ``train.draft`` of ``conf/train/*.yaml``, which holds every setting).

The pieces: ``data`` (corpus shards -> batches), ``losses`` (the head/draft losses), ``models`` (a
fresh head, what is stored), ``loop`` (``fit``: optimization, checkpoint/resume); ``recipe`` runs the
stages of ``train_head.py``.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from eagle2.head import EagleHead
from eagle2.training.data import Sequence, train_val_sequences
from eagle2.training.loop import fit
from eagle2.training.losses import LossProjection, draft_loss, head_loss
from eagle2.training.models import new_head


def _dtype(name: str) -> torch.dtype:
    from eagle2.models import resolve_dtype

    return resolve_dtype(name)


def _sequences(corpus_dir, cfg) -> tuple[list[Sequence], list[Sequence]]:
    return train_val_sequences(corpus_dir, cfg.val_fraction, cfg.max_train_sequences)


def train_head(target, corpus_dir: str | Path, cfg, out_dir: str | Path, **kwargs) -> tuple[EagleHead, dict]:
    """Train an EAGLE head on ``corpus_dir``; checkpoints and metrics go to ``out_dir``."""
    torch.manual_seed(cfg.seed)
    target.requires_grad_(False)
    train_seqs, val_seqs = _sequences(corpus_dir, cfg)
    head = new_head(target, cfg.init_from_target, cfg.num_layers)
    if cfg.init_from:  # continue from a trained head (published format); its draft vocabulary too
        from eagle2.head import load_head

        start = load_head(cfg.init_from, target)
        head.load_state_dict(start.state_dict(), strict=False)
        head.draft_vocab = start.draft_vocab
    proj = LossProjection(target.get_output_embeddings(), _dtype(cfg.loss_dtype))
    unroll = int(cfg.unroll)
    loss_fn = partial(head_loss, proj=proj, noise=cfg.noise, w_reg=cfg.w_reg, w_cls=cfg.w_cls, unroll=unroll,
                      unroll_cls_fraction=float(cfg.unroll_cls_fraction))
    # (the unroll settings are in the fingerprint only when unrolling: older checkpoints still resume)
    extra = {} if unroll == 1 else {"unroll": unroll, "unroll_cls_fraction": float(cfg.unroll_cls_fraction)}
    summary = fit(head, loss_fn, train_seqs, val_seqs, cfg, out_dir, desc="head", fingerprint_extra=extra, **kwargs)
    return head.eval(), summary


def train_draft(target, corpus_dir: str | Path, cfg, out_dir: str | Path, **kwargs):
    """Train an SpS draft model (``eagle2.draft_model``) on ``corpus_dir``."""
    from eagle2.draft_model import build_draft_model

    torch.manual_seed(cfg.seed)
    target.requires_grad_(False)
    train_seqs, val_seqs = _sequences(corpus_dir, cfg)
    draft = build_draft_model(target, cfg.num_layers, cfg.init_from_target)
    proj = LossProjection(target.get_output_embeddings(), _dtype(cfg.loss_dtype))
    loss_fn = partial(draft_loss, proj=proj, loss_on_prompt=cfg.loss_on_prompt)
    summary = fit(draft, loss_fn, train_seqs, val_seqs, cfg, out_dir, desc="draft", **kwargs)
    return draft.eval(), summary
