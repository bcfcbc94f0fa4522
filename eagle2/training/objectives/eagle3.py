"""The EAGLE-3 head objective (``train_head.py stage=eagle3``, settings ``train.eagle3``).

The head reads the inputs of three tapped target layers (``layer_features``) at step 1 and its own outputs
after, drafting over its own vocabulary (``draft_vocab_size`` most frequent answer tokens). No feature
regression: at every unrolled step ("training-time test", ``unroll`` steps weighted ``step_decay ** i``; the
authors: 7 and 0.8) the cross-entropy of its draft-vocabulary distribution against the target's next-token
distribution restricted to that vocabulary. The export is the official layout.

The authors' recipe is a set of settings here (``conf/train/sharegpt_eagle3_authors.yaml``): ``unroll``,
``unroll_cls_fraction``, ``step_decay``, the draft vocabulary by size (``draft_vocab_size``) or by the share of
answer tokens it covers (``draft_vocab_coverage``), ``mask_out_of_vocab`` (positions whose target argmax has
no draft id leave the loss), ``taps`` (the tapped layers; null: 2, L//2, L-3), ``eagle31_norms`` (EAGLE-3.1's
head) and the loop's optimizer settings.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from eagle2.core.features import eagle3_layers
from eagle2.heads.eagle3_head import FAMILY, Eagle3Head, eagle3_config_from_target, load_eagle3_head
from eagle2.training.data import Sequence, answer_token_counts, tokens_by_frequency
from eagle2.training.evaluation.agreement import agreement, ranked_ids
from eagle2.training.evaluation.evaluate import evaluate_drafter, feature_chain
from eagle2.training.evaluation.heldout import validation
from eagle2.training.objectives import Member, Objective, exported, module_chain, train_objective
from eagle2.training.support.losses import (
    LogitsSoftCrossEntropy,
    LossProjection,
    answer_positions,
    combine,
    loss_dtype,
    subsample,
    unrolled_predictions,
)
from eagle2.training.support.models import export
from eagle2.training.support.target_logits import TargetLogits, target_logits


def new_eagle3_head(target, draft_ids: torch.Tensor, taps: tuple[int, ...] | None = None,
                    eagle31: bool = False) -> Eagle3Head:
    """A fresh fp32 EAGLE-3 head for ``target`` drafting over the target tokens ``draft_ids``: random
    ``fc`` and layer, its ``norm`` and ``lm_head`` started from the target's final norm and the target's
    LM-head rows of those tokens (the head then begins as the target's own read-out). ``taps``: the fused
    target layers (None: EAGLE-3's 2, L//2, L-3); ``eagle31``: with EAGLE-3.1's norms."""
    L = target.config.num_hidden_layers
    config = eagle3_config_from_target(target.config, len(torch.unique(draft_ids)), eagle31=eagle31)
    head = Eagle3Head(config, tuple(taps) if taps else eagle3_layers(L))
    head.set_draft_vocabulary(draft_ids)
    with torch.no_grad():
        head.norm.weight.copy_(target.base_model.norm.weight)
        ids = head.draft_token_ids()
        weight = target.get_output_embeddings().weight
        head.lm_head.weight.copy_(weight if ids is None else weight[ids.to(weight.device)])
    head.attach_embedding(target.get_input_embeddings())
    return head.to(target.device, torch.float32)


def in_draft_vocab(head, target_argmax: torch.Tensor) -> torch.Tensor:
    """(N,) bool: whether the target's argmax over the FULL vocabulary (``target_argmax`` (N,)) has a draft id."""
    if head.draft_token_ids() is None:
        return torch.ones(len(target_argmax), dtype=torch.bool, device=target_argmax.device)
    return head.t2d.to(target_argmax.device)[target_argmax]


def per_position_targets(head, proj: LossProjection, target: TargetLogits, answer: torch.Tensor, unroll: int,
                         ids: torch.Tensor | None, with_mask: bool):
    """The target's draft-vocabulary distribution (B, L, V_draft) at every position some unroll step fits
    (step ``s`` fits position ``j + s`` for answer position ``j``; ``ids``: the draft vocabulary's target ids, None:
    the full one), and with ``with_mask`` whether its full-vocabulary argmax has a draft id there
    (``in_draft_vocab``; else None): read once per position from ``target``, not once per step."""
    used = torch.zeros(target.shape, dtype=torch.bool, device=answer.device)
    for step in range(1, unroll + 1):
        if answer.shape[1] - step + 1 > 0:
            used[:, step:] |= answer[:, step - 1:]
    at = target.positions()[used]
    draft_logits = target(proj, at, ids)
    q = draft_logits.new_zeros((*target.shape, draft_logits.shape[-1]))
    q[used] = torch.softmax(draft_logits, -1)
    if not with_mask:
        return q, None
    keep = torch.zeros_like(used)
    chunks = [at[a:a + 1024] for a in range(0, max(len(at), 1), 1024)]  # (N, V) fp32 never at once
    keep[used] = in_draft_vocab(head, torch.cat([target(proj, c).argmax(-1) for c in chunks]))
    return q, keep


def eagle3_loss(head, batch: dict, *, proj: LossProjection, unroll: int = 1, unroll_cls_fraction: float = 1.0,
                step_decay: float = 1.0, mask_out_of_vocab: bool = False, generator: torch.Generator | None = None,
                train: bool = True, with_stats: bool = True):
    """EAGLE-3 loss over a batch (tokens only, no feature regression): at every draft step, the
    cross-entropy of the head's own draft-vocabulary distribution ``lm_head(norm(p))`` against the
    target's next-token distribution restricted to the draft vocabulary, ``softmax(lm_head_T(f[j+1])[draft])``
    (``proj``: the target's LM head; its draft rows are taken here). The head reads the tapped layers
    (``layer_features``) at step 1 and its own outputs after (``unrolled_predictions``), and steps >= 2
    may use a random ``unroll_cls_fraction`` of their positions when training; step ``i`` (from 0) weighs
    ``step_decay ** i`` (EAGLE-3's authors: 0.8, normalized here by the weights' sum). ``mask_out_of_vocab``
    (training only; the authors' rule): a position whose target argmax over the full vocabulary has no draft
    id leaves the loss (``in_draft_vocab``; its share is ``oov`` in the stats). ``top1`` (step 1) is
    agreement with the target's argmax over the FULL vocabulary (a token outside the draft vocabulary is
    a miss), as ``agreement`` defines it, in training rows too (computed on logged steps only)."""
    proj = proj if train else proj.exact()
    if "layer_features" not in batch:
        raise ValueError("an EAGLE-3 head trains on a corpus with layer_features (train.corpus.tap_layers=eagle3)")
    feats = batch["features"]
    ids = head.draft_token_ids()
    readout = head.drafting_lm_head()
    answer = answer_positions(batch)
    target = target_logits(batch)
    with torch.no_grad():  # the target side of every step, once per position (step s reads positions j + s)
        target_q, target_keep = per_position_targets(head, proj, target, answer, unroll, ids,
                                                     mask_out_of_vocab and train)
    losses, stats = [], {}
    for step, pred, sel in unrolled_predictions(head, batch["tokens"], batch["layer_features"][:, :-1],
                                                answer, unroll):
        n = int(sel.sum())
        if n == 0:
            continue
        p, at, q = pred[sel], target.positions(step)[sel], target_q[:, step:][sel]
        keep = None if target_keep is None else target_keep[:, step:][sel]
        pick = subsample(n, unroll_cls_fraction, generator, p.device) if step > 1 and train else None
        if pick is not None:
            p, at, q = p[pick], at[pick], q[pick]
            keep = None if keep is None else keep[pick]
        if keep is not None:
            if step == 1:
                stats["oov"] = 1.0 - float(keep.float().mean())
            if not bool(keep.any()):
                continue
            p, at, q = p[keep], at[keep], q[keep]
        logits = readout(p)
        ce = LogitsSoftCrossEntropy.apply(logits, q)
        losses.append(ce)
        if with_stats:
            with torch.no_grad():
                step_stats = agreement(logits.detach(), target(proj, at), ks=(1,) if train or step > 1 else (1, 4),
                                       vocab_ids=ids)
            if step == 1:
                stats.update(step_stats, cls=ce.item())
            else:
                stats.update({f"top1_s{step}": step_stats["top1"], f"n_s{step}": step_stats["n"]})
        elif step == 1:
            stats["n"] = n
    return combine(losses, stats, feats, step_decay)


def coverage_size(counts: torch.Tensor, coverage: float) -> int:
    """The fewest most-frequent tokens whose occurrences make up at least ``coverage`` of all ``counts``."""
    if not 0 < coverage <= 1:
        raise ValueError(f"train.eagle3.draft_vocab_coverage must be in (0, 1], not {coverage}")
    share = torch.cumsum(torch.sort(counts.double(), descending=True).values, 0) / counts.sum()
    return int(torch.searchsorted(share, torch.tensor(coverage, dtype=share.dtype) - 1e-12)) + 1


def draft_vocabulary_ids(corpus_dir: str | Path, size: int | None, vocab_size: int,
                         coverage: float | None = None) -> torch.Tensor:
    """Target token ids for an EAGLE-3 draft vocabulary: the ``size`` most frequent in the corpus answers
    (with ``coverage``: as many as cover that share of the answer tokens, ``coverage_size``), then (if the
    answers use fewer) the lowest unused ids, so the size is always ``size``."""
    if coverage is not None:
        size = coverage_size(answer_token_counts(corpus_dir), float(coverage))
    size = min(int(size), vocab_size)
    seen = tokens_by_frequency(corpus_dir, limit=size)
    if len(seen) < size:
        unused = torch.ones(vocab_size, dtype=torch.bool)
        unused[seen] = False
        seen = torch.cat([seen, unused.nonzero()[:, 0][: size - len(seen)]])
    return seen


def eagle3_setup(target, corpus_dir: str | Path, cfg):
    """(fresh or continued EAGLE-3 head, its loss function, its fingerprint settings) for ``cfg``."""
    if cfg.init_from:
        head = load_eagle3_head(cfg.init_from, target).float().requires_grad_(True)
    else:
        ids = draft_vocabulary_ids(corpus_dir, cfg.draft_vocab_size, target.config.vocab_size,
                                   cfg.get("draft_vocab_coverage"))
        head = new_eagle3_head(target, ids, cfg.get("taps"), bool(cfg.get("eagle31_norms", False)))
    proj = LossProjection(target.get_output_embeddings(), loss_dtype(cfg.loss_dtype))
    unroll = int(cfg.unroll)
    decay = float(cfg.get("step_decay") or 1.0)  # step i of the unroll weighs decay ** i
    mask = bool(cfg.get("mask_out_of_vocab", False))
    loss_fn = partial(eagle3_loss, proj=proj, unroll=unroll, unroll_cls_fraction=float(cfg.unroll_cls_fraction),
                      step_decay=decay, mask_out_of_vocab=mask)
    extra = {"type": "eagle3", "unroll": unroll, "unroll_cls_fraction": float(cfg.unroll_cls_fraction),
             "draft_vocab_size": head.draft_vocab_size, **({"step_decay": decay} if decay != 1.0 else {})}
    # (each recipe setting in the fingerprint only when it is not the default: older checkpoints still resume)
    extra |= {"mask_out_of_vocab": True} if mask else {}
    extra |= {"eagle31_norms": True} if head.tap_norms is not None else {}
    extra |= {"taps": list(head.feature_layers)} if cfg.get("taps") else {}
    return head, loss_fn, extra


def train_eagle3_head(target, corpus_dir: str | Path, cfg, out_dir: str | Path, **kwargs):
    """Train an EAGLE-3 head (``eagle2.heads.eagle3_head``) on a corpus with the tapped layers recorded (or a
    token corpus: online features); a ``cfg.init_from`` head (official layout) is continued, vocabulary
    included. ``kwargs`` as for ``eagle.train_head``."""
    torch.manual_seed(cfg.seed)
    head, loss_fn, extra = eagle3_setup(target, corpus_dir, cfg)
    return train_objective(head, loss_fn, target, corpus_dir, cfg, out_dir, desc="eagle3", fingerprint_extra=extra,
                           tap_layers=head.feature_layers, **kwargs)


def eagle3_chain(head, seq: Sequence, anchors: list[int], depth: int) -> torch.Tensor:
    """(A, depth) tokens drafted greedily by an EAGLE-3 head (its own LM head, mapped to target ids)."""
    readout, ids = head.drafting_lm_head(), head.draft_token_ids()

    def to_token(f):
        return ranked_ids(readout(f), 1, ids)[:, 0]
    return feature_chain(head, seq.layer_features, to_token, seq, anchors, depth)


def evaluate_eagle3_head(head, target, seqs: list[Sequence], cfg) -> dict:
    """Teacher-forced top-1/top-4 (full-vocabulary argmax) and greedy-chain acceptance of an EAGLE-3 head."""
    proj = LossProjection(target.get_output_embeddings(), torch.float32)
    return evaluate_drafter(head, seqs, cfg, partial(eagle3_loss, proj=proj), partial(eagle3_chain, head))


def export_eagle3(head, summary: dict, cfg, root: Path, section: str = "eagle3") -> Path:
    """Store a trained EAGLE-3 head (official layout) at ``train.export.eagle3_head`` with its card."""
    return export(head, FAMILY, summary, cfg, root, kind="eagle3", export_key="eagle3_head", section=section)


def eagle3_stage(target, tokenizer, cfg, root: Path) -> Path | None:
    """Train the EAGLE-3 head (resuming) and export it to ``train.export.eagle3_head``."""
    c = cfg.train.eagle3
    head, summary = train_eagle3_head(target, root / cfg.train.corpus.out_dir, c, root / c.out_dir,
                                      stop_after=c.stop_after,
                                      **validation(target, tokenizer, cfg, root, "eagle3", module_chain(eagle3_chain)))
    return export_eagle3(head, summary, cfg, root) if exported(summary) else None


OBJECTIVE = Objective("eagle3", "EAGLE-3 head", eagle3_stage, order=2, export_key="eagle3_head",
                      family=FAMILY, evaluate=evaluate_eagle3_head,
                      member=Member(eagle3_setup, export_eagle3, module_chain(eagle3_chain)), weights=("init_from",))
