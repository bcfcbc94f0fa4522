"""Several draft heads trained on the same batches, fed by ONE teacher-forced target forward.

An EAGLE head reads the target's last hidden states, an EAGLE-3 head the inputs of three tapped layers; both
come out of the same forward (``online.OnlineFeatures`` with the union of the heads' taps), which is most of a
training step's cost on a small target. ``JointHeads`` holds the heads as one module, so the trainer
(``loop.fit``) gives them one optimizer, one schedule, one checkpoint and one warm-resume state; the heads
share no parameter, so AdamW updates each exactly as a separate run on the same batches would (gradients are
clipped per head, ``clip_gradients``). ``joint_loss`` sums the heads' losses and reports each head's stats
under its name (``eagle3/top1``); the ``primary`` head's stats also go unprefixed, so the learning curve and
the flat-curve stop follow that head.
"""

from __future__ import annotations

import torch

from eagle2.training.models import SHARED_KEYS


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


def clip_gradients(module: torch.nn.Module, params: list[torch.Tensor], max_norm: float) -> float:
    """Clip gradients to ``max_norm``: per head for ``JointHeads`` (each as its own run would), else over
    ``params``; returns the largest norm before clipping."""
    if not isinstance(module, JointHeads):
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    norms = [torch.nn.utils.clip_grad_norm_([p for p in head.parameters() if p.requires_grad], max_norm)
             for head in module.heads.values()]
    return max(float(n) for n in norms)
