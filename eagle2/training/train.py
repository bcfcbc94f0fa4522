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

from eagle2.heads.eagle_head import EagleHead
from eagle2.training.data import Sequence, is_token_corpus, train_val_sequences
from eagle2.training.loop import autocast_dtype, fit
from eagle2.training.losses import LossProjection, draft_loss, head_loss
from eagle2.training.models import new_head
from eagle2.training.online import OnlineFeatures, body_dtype


def loss_dtype(name: str) -> torch.dtype:
    """A loss dtype setting; ``auto`` is bf16 where the CPU multiplies bf16 natively (~2.5x faster
    there) and fp32 elsewhere (on an AVX2-only CPU a bf16 LM-head matmul is many times slower)."""
    from eagle2.core.cpu import cpu_has_native_bf16
    from eagle2.core.precision import resolve_dtype

    if name == "auto":
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    return resolve_dtype(name)


def _sequences(corpus_dir, cfg, val_seqs: list[Sequence] | None = None
               ) -> tuple[list[Sequence], list[Sequence], dict[str, list[str]]]:
    """(train, held-out, shard names): ``val_seqs``, when given, replace the corpus's held-out shards as
    the validation set (those shards still stay out of training while ``cfg.val_fraction`` > 0)."""
    train, val, shards = train_val_sequences(corpus_dir, cfg.val_fraction, cfg.max_train_sequences,
                                             cfg.get("resident_shards"))
    return train, (val if val_seqs is None else val_seqs), shards


def featurizer(target, corpus_dir, cfg, tap_layers=()) -> OnlineFeatures | None:
    """Online features for a token corpus (``data.is_token_corpus``), in the training autocast dtype, the
    target's weights in ``cfg.target_dtype`` (``online.body_dtype``); None for a feature corpus."""
    if not is_token_corpus(corpus_dir):
        return None
    return OnlineFeatures(target, tap_layers, autocast_dtype(cfg.get("autocast", "auto"), target.device),
                          body_dtype(cfg.get("target_dtype", "auto"), target.device))


def online_fingerprint(featurize: OnlineFeatures | None) -> dict:
    """What a run's checkpoints record of its feature source: ``features: online`` and, when the target's
    weights were cast for the forward, their dtype."""
    if featurize is None:
        return {}
    cast = featurize.body is not featurize.target.base_model
    return {"features": "online",
            **({"target_dtype": str(next(featurize.body.parameters()).dtype).replace("torch.", "")} if cast else {})}


def _cls_vocab(corpus_dir, cfg) -> torch.Tensor | None:
    """The token ids the soft cross-entropy runs over (``cfg.cls_vocab_size`` most frequent answer tokens,
    the head's drafting vocabulary); None: the full vocabulary."""
    size = cfg.get("cls_vocab_size")
    if not size:
        return None
    from eagle2.training.data import tokens_by_frequency

    return tokens_by_frequency(corpus_dir, limit=int(size))


def train_head(target, corpus_dir: str | Path, cfg, out_dir: str | Path, val_seqs: list[Sequence] | None = None,
               **kwargs) -> tuple[EagleHead, dict]:
    """Train an EAGLE head on ``corpus_dir``; checkpoints and metrics go to ``out_dir``. ``val_seqs``: the
    validation set instead of the corpus's held-out shards; ``kwargs`` go to ``loop.fit``."""
    torch.manual_seed(cfg.seed)
    target.requires_grad_(False)
    train_seqs, val_seqs, shards = _sequences(corpus_dir, cfg, val_seqs)
    head, loss_fn, extra = head_setup(target, cfg, _cls_vocab(corpus_dir, cfg))
    featurize = featurizer(target, corpus_dir, cfg)
    extra |= online_fingerprint(featurize)
    summary = fit(head, loss_fn, train_seqs, val_seqs, cfg, out_dir, desc="head", fingerprint_extra=extra,
                  featurize=featurize, **kwargs)
    summary["corpus_shards"] = shards  # what this run read (training.json)
    return head.eval(), summary


def head_setup(target, cfg, cls_vocab: torch.Tensor | None = None) -> tuple[EagleHead, object, dict]:
    """(fresh or continued EAGLE head, its loss function, its fingerprint settings) for ``cfg``; the soft
    cross-entropy runs over ``cls_vocab`` (None: the full vocabulary)."""
    head = new_head(target, cfg.init_from_target, cfg.num_layers)
    if cfg.init_from:  # continue from a trained head (published format); its draft vocabulary too
        from eagle2.heads.eagle_head import load_head

        start = load_head(cfg.init_from, target)
        head.load_state_dict(start.state_dict(), strict=False)
        head.draft_vocab = start.draft_vocab
    if cls_vocab is not None:  # it drafts over the vocabulary it was trained over
        head.draft_vocab = cls_vocab.clone()
    proj = LossProjection(target.get_output_embeddings(), loss_dtype(cfg.loss_dtype), cls_vocab)
    unroll = int(cfg.unroll)
    loss_fn = partial(head_loss, proj=proj, noise=cfg.noise, w_reg=cfg.w_reg, w_cls=cfg.w_cls, unroll=unroll,
                      unroll_cls_fraction=float(cfg.unroll_cls_fraction))
    # (the unroll settings are in the fingerprint only when unrolling: older checkpoints still resume)
    extra = {} if unroll == 1 else {"unroll": unroll, "unroll_cls_fraction": float(cfg.unroll_cls_fraction)}
    if cls_vocab is not None:
        extra["cls_vocab_size"] = len(cls_vocab)
    return head, loss_fn, extra


def draft_vocabulary_ids(corpus_dir: str | Path, size: int, vocab_size: int) -> torch.Tensor:
    """``size`` target token ids for an EAGLE-3 draft vocabulary: the most frequent in the corpus
    answers, then (if the answers use fewer) the lowest unused ids, so the size is always ``size``."""
    from eagle2.training.data import tokens_by_frequency

    size = min(int(size), vocab_size)
    seen = tokens_by_frequency(corpus_dir, limit=size)
    if len(seen) < size:
        unused = torch.ones(vocab_size, dtype=torch.bool)
        unused[seen] = False
        seen = torch.cat([seen, unused.nonzero()[:, 0][: size - len(seen)]])
    return seen


def train_eagle3_head(target, corpus_dir: str | Path, cfg, out_dir: str | Path, val_seqs: list[Sequence] | None = None,
                      **kwargs):
    """Train an EAGLE-3 head (``eagle2.heads.eagle3_head``) on a corpus with the tapped layers recorded:
    draft vocabulary by answer-token frequency (``cfg.draft_vocab_size``), ``cfg.unroll`` steps of
    training-time test. A ``cfg.init_from`` head (official layout) is continued, vocabulary included.
    ``val_seqs`` and ``kwargs`` as for ``train_head``."""
    torch.manual_seed(cfg.seed)
    target.requires_grad_(False)
    train_seqs, val_seqs, shards = _sequences(corpus_dir, cfg, val_seqs)
    head, loss_fn, extra = eagle3_setup(target, corpus_dir, cfg)
    featurize = featurizer(target, corpus_dir, cfg, head.feature_layers)
    extra |= online_fingerprint(featurize)
    summary = fit(head, loss_fn, train_seqs, val_seqs, cfg, out_dir, desc="eagle3", fingerprint_extra=extra,
                  featurize=featurize, **kwargs)
    summary["corpus_shards"] = shards  # what this run read (training.json)
    return head.eval(), summary


def eagle3_setup(target, corpus_dir: str | Path, cfg):
    """(fresh or continued EAGLE-3 head, its loss function, its fingerprint settings) for ``cfg``."""
    from eagle2.training.losses import eagle3_loss
    from eagle2.training.models import new_eagle3_head

    if cfg.init_from:
        from eagle2.heads.eagle3_head import load_eagle3_head

        head = load_eagle3_head(cfg.init_from, target).float().requires_grad_(True)
    else:
        head = new_eagle3_head(target, draft_vocabulary_ids(corpus_dir, cfg.draft_vocab_size,
                                                            target.config.vocab_size))
    proj = LossProjection(target.get_output_embeddings(), loss_dtype(cfg.loss_dtype))
    unroll = int(cfg.unroll)
    decay = float(cfg.get("step_decay") or 1.0)  # step i of the unroll weighs decay ** i
    loss_fn = partial(eagle3_loss, proj=proj, unroll=unroll, unroll_cls_fraction=float(cfg.unroll_cls_fraction),
                      step_decay=decay)
    extra = {"type": "eagle3", "unroll": unroll, "unroll_cls_fraction": float(cfg.unroll_cls_fraction),
             "draft_vocab_size": head.draft_vocab_size, **({"step_decay": decay} if decay != 1.0 else {})}
    return head, loss_fn, extra


def train_joint(target, corpus_dir: str | Path, train_cfg, out_dir: str | Path,
                val_seqs: list[Sequence] | None = None, **kwargs) -> tuple[dict, dict]:
    """Train an EAGLE head (``train_cfg.head``'s settings) and an EAGLE-3 head (``train_cfg.eagle3``'s) on the
    same batches, one target forward each (``joint.py``); the loop's settings are ``train_cfg.joint``. Returns
    ({"head": ..., "eagle3": ...}, summary); ``val_seqs`` and ``kwargs`` as for ``train_head``."""
    from eagle2.training.joint import JointHeads, joint_loss

    cfg = train_cfg.joint
    target.requires_grad_(False)
    train_seqs, val_seqs, shards = _sequences(corpus_dir, cfg, val_seqs)
    torch.manual_seed(train_cfg.head.seed)  # each head starts as its own run would
    head, head_fn, head_extra = head_setup(target, train_cfg.head, _cls_vocab(corpus_dir, train_cfg.head))
    torch.manual_seed(train_cfg.eagle3.seed)
    eagle3, eagle3_fn, eagle3_extra = eagle3_setup(target, corpus_dir, train_cfg.eagle3)
    module = JointHeads({"head": head, "eagle3": eagle3}, primary=cfg.primary)
    featurize = featurizer(target, corpus_dir, cfg, module.tap_layers())
    extra = {"joint": {"head": head_extra, "eagle3": eagle3_extra}, **online_fingerprint(featurize)}
    loss_fn = partial(joint_loss, losses={"head": head_fn, "eagle3": eagle3_fn})
    summary = fit(module, loss_fn, train_seqs, val_seqs, cfg, out_dir, desc="joint", fingerprint_extra=extra,
                  featurize=featurize, **kwargs)
    summary["corpus_shards"] = shards  # what this run read (training.json)
    return {name: h.eval() for name, h in module.heads.items()}, summary


def train_draft(target, corpus_dir: str | Path, cfg, out_dir: str | Path, **kwargs):
    """Train an SpS draft model (``eagle2.heads.draft_model``) on ``corpus_dir``."""
    from eagle2.heads.draft_model import build_draft_model

    torch.manual_seed(cfg.seed)
    target.requires_grad_(False)
    train_seqs, val_seqs, shards = _sequences(corpus_dir, cfg)
    draft = build_draft_model(target, cfg.num_layers, cfg.init_from_target)
    proj = LossProjection(target.get_output_embeddings(), loss_dtype(cfg.loss_dtype))
    loss_fn = partial(draft_loss, proj=proj, loss_on_prompt=cfg.loss_on_prompt)
    summary = fit(draft, loss_fn, train_seqs, val_seqs, cfg, out_dir, desc="draft", **kwargs)
    summary["corpus_shards"] = shards  # what this run read (training.json)
    return draft.eval(), summary
