"""Several draft heads trained on the same batches, fed by ONE teacher-forced target forward.

An EAGLE head reads the target's last hidden states, an EAGLE-3 head the inputs of three tapped layers; both
come out of the same forward (``features.OnlineFeatures`` with the union of the heads' taps), which is most of a
training step's cost on a small target. ``JointHeads`` holds the heads as one module, so the trainer
(``loop.fit``) gives them one optimizer, one schedule, one checkpoint and one warm-resume state; the heads
share no parameter, so AdamW updates each exactly as a separate run on the same batches would (gradients are
clipped per head, ``JointHeads.clip_gradients``). ``joint_loss`` sums the heads' losses and reports each head's
stats under its name (``eagle3/top1``); the ``primary`` head's stats also go unprefixed, so the learning curve
and the flat-curve stop follow that head. ``train_head.py stage=joint``: the loop's settings are ``train.joint``,
each head's own ``train.head`` / ``train.eagle3``; both are exported as their own stages export them.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from eagle2.training.evaluation.heldout import validation
from eagle2.training.objectives import Objective, exported, train_objective
from eagle2.training.objectives.eagle import cls_vocab, export_head, head_setup
from eagle2.training.objectives.eagle3 import eagle3_setup, export_eagle3
from eagle2.training.support.models import SHARED_KEYS


class JointHeads(torch.nn.Module):
    """Named heads (``{"head": EagleHead, "eagle3": Eagle3Head}``) trained together; ``primary`` names the
    head whose held-out top-1 is the run's curve."""

    def __init__(self, heads: dict[str, torch.nn.Module], primary: str):
        super().__init__()
        if primary not in heads:
            raise ValueError(f"the primary head {primary!r} is not one of {sorted(heads)}")
        self.heads = torch.nn.ModuleDict(heads)
        self.primary = primary
        # what ``models.trainable_state`` leaves out: each head's shared target weights, under its name
        self.shared_keys = tuple(f"heads.{name}.{key}" for name, head in heads.items()
                                 for key in getattr(head, "shared_keys", SHARED_KEYS))

    def tap_layers(self) -> tuple[int, ...]:
        """The target layers whose inputs the heads read (EAGLE-3's, in its order: ``layer_features``); heads
        that tap different layers cannot share one batch layout."""
        taps = {tuple(head.feature_layers) for head in self.heads.values() if getattr(head, "feature_layers", None)}
        if len(taps) > 1:
            raise ValueError(f"the heads tap different target layers ({sorted(taps)}): train them apart")
        return next(iter(taps), ())

    def clip_gradients(self, max_norm: float) -> float:
        """Clip each head's gradients to ``max_norm`` (as its own run would); returns the largest norm before."""
        return max(float(torch.nn.utils.clip_grad_norm_([p for p in head.parameters() if p.requires_grad], max_norm))
                   for head in self.heads.values())


def joint_loss(module: JointHeads, batch: dict, *, losses: dict, generator: torch.Generator | None = None,
               train: bool = True, with_stats: bool = True):
    """The sum of each head's loss (``losses[name](head, batch, ...)``) on one featurized batch; stats of
    head ``name`` as ``name/key`` (counts left out but the per-step ones, ``name/n_s2``), the primary
    head's also unprefixed (``top1``, ``n``: what the trainer's curve and position weights read)."""
    total, stats = None, {}
    for name, head in module.heads.items():
        loss, head_stats = losses[name](head, batch, generator=generator, train=train, with_stats=with_stats)
        total = loss if total is None else total + loss
        stats |= {f"{name}/{key}": value for key, value in head_stats.items() if key != "n"}
        if name == module.primary:
            stats |= head_stats
    return total, stats


def train_joint(target, corpus_dir: str | Path, train_cfg, out_dir: str | Path, **kwargs) -> tuple[dict, dict]:
    """Train an EAGLE head (``train_cfg.head``'s settings) and an EAGLE-3 head (``train_cfg.eagle3``'s) on the
    same batches, one target forward each; the loop's settings are ``train_cfg.joint``. Returns
    ({"head": ..., "eagle3": ...}, summary); ``kwargs`` as for ``eagle.train_head``."""
    cfg = train_cfg.joint
    target.requires_grad_(False)
    torch.manual_seed(train_cfg.head.seed)  # each head starts as its own run would
    head, head_fn, head_extra = head_setup(target, train_cfg.head, cls_vocab(corpus_dir, train_cfg.head))
    torch.manual_seed(train_cfg.eagle3.seed)
    eagle3, eagle3_fn, eagle3_extra = eagle3_setup(target, corpus_dir, train_cfg.eagle3)
    module = JointHeads({"head": head, "eagle3": eagle3}, primary=cfg.primary)
    module, summary = train_objective(module, partial(joint_loss, losses={"head": head_fn, "eagle3": eagle3_fn}),
                                      target, corpus_dir, cfg, out_dir, desc="joint", tap_layers=module.tap_layers(),
                                      fingerprint_extra={"joint": {"head": head_extra, "eagle3": eagle3_extra}},
                                      **kwargs)
    return dict(module.heads.items()), summary


def joint_stage(target, tokenizer, cfg, root: Path) -> list[Path] | None:
    """Train both heads (resuming) and export each as its own stage does."""
    jcfg = cfg.train.joint
    if jcfg.get("val_set", "corpus") == "mtbench":
        raise ValueError("train.joint.val_set: corpus or a corpus folder (the MT-bench chain tau is per head: "
                         "measure it with stage=eval)")
    heads, summary = train_joint(target, root / cfg.train.corpus.out_dir, cfg.train, root / jcfg.out_dir,
                                 stop_after=jcfg.stop_after, **validation(target, tokenizer, cfg, root, "joint"))
    if not exported(summary):
        return None
    return [export_head(heads["head"], summary, cfg, root, "joint"),
            export_eagle3(heads["eagle3"], summary, cfg, root, "joint")]


OBJECTIVE = Objective("joint", "EAGLE and EAGLE-3 heads", joint_stage)
