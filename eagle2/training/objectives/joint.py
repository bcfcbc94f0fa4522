"""Several draft heads trained on the same batches, fed by ONE teacher-forced target forward.

``train.joint.heads`` lists the members by stage name (default ``[head, eagle3]``: the EAGLE and the EAGLE-3 head;
``hass`` joins as a third; any objective that declares ``member=Member(...)``, ``objectives/__init__.py``, can be
listed). Each member is built from its own section ``train.<stage>`` (its ``setup``) and trained on its own loss,
the function its own stage trains with. An EAGLE or HASS head reads the target's last hidden states, an EAGLE-3
head the inputs of its tapped layers; all come out of the same forward (``features.OnlineFeatures``, tapping the
union of the members' layers once, ``tap_layout``; each member reads its own layers, ``JointHeads.member_batch``),
which is most of a training step's cost on a small target.

``JointHeads`` holds the heads as one module, so the trainer (``loop.fit``) gives them one optimizer, one
schedule, one checkpoint and one warm-resume state; the heads share no parameter, so AdamW updates each exactly
as a separate run on the same batches would (gradients are clipped per head, ``JointHeads.clip_gradients``).
The settings rule: the loop's settings (optimizer, LR schedule, steps, batches, validation, clipping threshold)
are ``train.joint``'s, the same for every member; each head's own settings (``init_from``, ``seed`` of its
initialisation, loss weights, unroll, vocabulary, taps) are its section's. Every member sees the same batches
(equal tokens). ``joint_loss`` sums the heads' losses and reports each head's stats under its name
(``eagle3/top1``, ``hass/loss``); the ``primary`` head's stats also go unprefixed, so the learning curve and the
flat-curve stop follow that head. With ``val_set: mtbench`` each member's greedy-chain tau is measured too
(``name/chain_tau``; the primary's as ``chain_tau``), and ``best_by: tau`` keeps each member's own best validation
(``eagle2.training.best``). Each member is exported as
its own stage exports it (``Member.export``: its family's ``save``, to ``train.export.<export_key>``).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from eagle2.training.data import is_token_corpus
from eagle2.training.evaluation.heldout import validation
from eagle2.training.objectives import Member, Objective, exported, objectives, train_objective
from eagle2.training.support.models import SHARED_KEYS
from eagle2.training.support.target_logits import share_target_logits

DEFAULT_HEADS = ("head", "eagle3")  # train.joint.heads when the section does not say


def head_taps(head: torch.nn.Module) -> tuple[int, ...]:
    """The target layers whose inputs ``head`` reads, in its order (``feature_layers``; none: it reads none)."""
    return tuple(int(i) for i in (getattr(head, "feature_layers", None) or ()))


def tap_layout(taps: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The layers the joint forward taps for members tapping ``taps``: their one common tuple when they agree
    (as a run of that head alone taps), else each layer once, in the order the members first name it."""
    distinct = {t for t in taps if t}
    if len(distinct) <= 1:
        return next(iter(distinct), ())
    return tuple(dict.fromkeys(layer for t in taps for layer in t))


class JointHeads(torch.nn.Module):
    """Named heads (``{"head": EagleHead, "eagle3": Eagle3Head, ...}``) trained together; ``primary`` names the
    head whose held-out top-1 is the run's curve."""

    def __init__(self, heads: dict[str, torch.nn.Module], primary: str):
        super().__init__()
        if primary not in heads:
            raise ValueError(f"the primary head {primary!r} is not one of {sorted(heads)}")
        self.heads = torch.nn.ModuleDict(heads)
        self.primary = primary
        self.taps = {name: head_taps(head) for name, head in heads.items()}
        self.layout = tap_layout(list(self.taps.values()))
        # what ``models.trainable_state`` leaves out: each head's shared target weights, under its name
        self.shared_keys = tuple(f"heads.{name}.{key}" for name, head in heads.items()
                                 for key in getattr(head, "shared_keys", SHARED_KEYS))

    def tap_layers(self) -> tuple[int, ...]:
        """The target layers the joint forward taps (``tap_layout``): ``layer_features`` in this order."""
        return self.layout

    def member_batch(self, name: str, batch: dict) -> dict:
        """``batch`` as head ``name`` reads it: ``layer_features`` holding its own taps in its order (the batch
        itself when they are the joint layout, or when it taps nothing)."""
        taps = self.taps[name]
        if not taps or taps == self.layout or "layer_features" not in batch:
            return batch
        chunks = batch["layer_features"].chunk(len(self.layout), dim=-1)  # one (B, L, H) per tapped layer
        return {**batch, "layer_features": torch.cat([chunks[self.layout.index(i)] for i in taps], dim=-1)}

    def clip_gradients(self, max_norm: float) -> float:
        """Clip each head's gradients to ``max_norm`` (as its own run would); returns the largest norm before."""
        return max(float(torch.nn.utils.clip_grad_norm_([p for p in head.parameters() if p.requires_grad], max_norm))
                   for head in self.heads.values())


def joint_loss(module: JointHeads, batch: dict, *, losses: dict, generator: torch.Generator | None = None,
               train: bool = True, with_stats: bool = True):
    """The sum of each head's loss (``losses[name](head, its batch, ...)``) on one featurized batch, the target's
    logits computed once for all of them (``target_logits.share_target_logits``); stats of
    head ``name`` as ``name/key`` (counts left out but the per-step ones, ``name/n_s2``), the primary
    head's also unprefixed (``top1``, ``n``: what the trainer's curve and position weights read)."""
    total, stats = None, {}
    batch = share_target_logits(batch)  # the target's logits at a position: once for every member
    for name, head in module.heads.items():
        loss, head_stats = losses[name](head, module.member_batch(name, batch), generator=generator, train=train,
                                        with_stats=with_stats)
        total = loss if total is None else total + loss
        stats |= {f"{name}/{key}": value for key, value in head_stats.items() if key != "n"}
        if name == module.primary:
            stats |= head_stats
    return total, stats


def joint_members(cfg, members: dict[str, Member] | None = None) -> dict[str, Member]:
    """The members ``train.joint.heads`` lists (``cfg``: the ``train`` section), each with its section, in that
    order; ``members``: the declarations to pick from (default: every objective's ``member``). One line each
    for an unknown name, a stage that cannot join, a missing section or a primary that is not a member."""
    members = members or {o.stage: o.member for o in objectives().values() if o.member is not None}
    names = [str(n) for n in (cfg.joint.get("heads") or DEFAULT_HEADS)]
    for name in names:
        if name not in members:
            raise ValueError(f"train.joint.heads: {name!r} cannot join a joint run (those that can: "
                             f"{', '.join(sorted(members))})")
        if cfg.get(name) is None:
            raise ValueError(f"train.joint.heads lists {name}, and this train config has no train.{name} section")
    if len(set(names)) != len(names):
        raise ValueError(f"train.joint.heads lists a head twice: {names}")
    if cfg.joint.primary not in names:
        raise ValueError(f"train.joint.primary: {cfg.joint.primary!r} is not one of train.joint.heads {names}")
    return {name: members[name] for name in names}


def train_joint(target, corpus_dir: str | Path, train_cfg, out_dir: str | Path, *,
                members: dict[str, Member] | None = None, **kwargs) -> tuple[dict, dict]:
    """Train the heads of ``train_cfg.joint.heads`` (``joint_members``; each from its own section, seeded with its
    ``seed`` as its own run is) on the same batches, one target forward each; the loop's settings are
    ``train_cfg.joint``. Returns ({name: head}, summary); ``kwargs`` as for ``eagle.train_head``."""
    chosen = joint_members(train_cfg, members)
    target.requires_grad_(False)
    heads, losses, extras = {}, {}, {}
    for name, member in chosen.items():
        torch.manual_seed(train_cfg[name].seed)  # each head starts as its own run would
        heads[name], losses[name], extras[name] = member.setup(target, corpus_dir, train_cfg[name])
    module = JointHeads(heads, primary=train_cfg.joint.primary)
    if len({t for t in module.taps.values() if t}) > 1 and not (is_token_corpus(corpus_dir)
                                                                and "val_seqs" not in kwargs):
        raise ValueError(f"train.joint.heads tap different target layers ({module.taps}): that needs a token "
                         f"corpus (online features) validated on its own held-out shards (val_set: corpus)")
    module, summary = train_objective(module, partial(joint_loss, losses=losses), target, corpus_dir, train_cfg.joint,
                                      out_dir, desc="joint", tap_layers=module.tap_layers(),
                                      fingerprint_extra={"joint": extras}, **kwargs)
    return dict(module.heads.items()), summary


def joint_chains(members: dict[str, Member]):
    """The joint run's ``chain`` for validation on MT-bench (``heldout.validation``): each member's greedy chain
    drafter as ``name/`` (its ``chain_tau`` as ``name/chain_tau``), the primary head's also unprefixed."""

    def chains(module: JointHeads, target) -> dict:
        own = {f"{name}/": members[name].chain(head, target) for name, head in module.heads.items()
               if members[name].chain is not None}
        return own | ({"": own[f"{module.primary}/"]} if f"{module.primary}/" in own else {})
    return chains


def joint_stage(target, tokenizer, cfg, root: Path) -> list[Path] | None:
    """Train the listed heads (resuming) and export each as its own stage does."""
    jcfg = cfg.train.joint
    chosen = joint_members(cfg.train)
    heads, summary = train_joint(target, root / cfg.train.corpus.out_dir, cfg.train, root / jcfg.out_dir,
                                 stop_after=jcfg.stop_after,
                                 **validation(target, tokenizer, cfg, root, "joint", joint_chains(chosen)))
    if not exported(summary):
        return None
    return [member.export(heads[name], summary, cfg, root, "joint") for name, member in chosen.items()]


def check_joint(cfg) -> None:
    """The preflight of ``train.joint``: its members (``joint_members``), before the target loads."""
    joint_members(cfg.train)


OBJECTIVE = Objective("joint", "jointly trained heads (train.joint.heads)", joint_stage, check=check_joint,
                      reads=lambda train: tuple(joint_members(train)))
