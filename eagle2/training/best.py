"""The held-out curve of a training run: when it is flat (``curve_flat``, the trainer's stop) and its best
checkpoint by a held-out measure (``train.<section>.best_by``).

``last`` (the default) keeps nothing: the run exports its last weights. ``top1``, ``tau`` or ``loss``: each
validation that beats the best so far writes the trained weights to ``<out_dir>/best.pt``, and a finished run
ends with those weights in the module, so the export is the best checkpoint. ``tau`` is the greedy-chain tau of
``val_set: mtbench`` (the validation rows' ``chain_tau``): an EAGLE-3 head's tau can peak and then fall while its
loss keeps falling, so its checkpoint is chosen by tau. The trainer's flat-curve stop follows the same measure.
"""

from __future__ import annotations

from pathlib import Path

import torch

from eagle2.training.support import distributed
from eagle2.training.support.models import trainable_state

BEST_BY = {"top1": ("top1", 1.0), "tau": ("chain_tau", 1.0), "loss": ("loss", -1.0)}  # measure -> (stat, sign)


def curve_flat(values: list[float], evals: int, min_gain: float) -> bool:
    """Whether a held-out curve has flattened: over its last ``evals`` values its best gained less than
    ``min_gain`` on its best before them (so at least ``evals + 1`` values are needed). A curve that
    keeps rising by less than ``min_gain`` a validation is not flat: its gain is counted over the window."""
    if evals < 1 or len(values) <= evals:
        return False
    return max(values[-evals:]) - max(values[:-evals]) < min_gain


def best_measure(setting: str | None) -> tuple[str, float] | None:
    """(the validation stat, its sign: larger is better) that a ``best_by`` setting names; None for ``last``."""
    setting = str(setting or "last")
    if setting == "last":
        return None
    if setting not in BEST_BY:
        raise ValueError(f"train.*.best_by must be last, top1, tau or loss, not {setting!r}")
    return BEST_BY[setting]


class BestCheckpoint:
    """The best validation so far (``best``: step, value, stat) and its weights in ``best.pt``."""

    def __init__(self, setting: str | None, out_dir: str | Path):
        self.measure = best_measure(setting)
        self.path = Path(out_dir) / "best.pt"
        self.best: dict | None = None

    def value(self, stats: dict, module: torch.nn.Module, step: int) -> float:
        """The measure of a validation (top-1 under ``last``); a new best writes ``best.pt`` (rank 0)."""
        if self.measure is None:
            return float(stats["top1"])
        stat, sign = self.measure
        if stat not in stats:
            raise ValueError(f"train.*.best_by: the validation has no {stat} (tau needs val_set: mtbench)")
        value = sign * float(stats[stat])
        if self.best is None or value > self.best["value"]:
            self.best = {"step": step, "value": value, "by": stat}
            if distributed.is_main():
                tmp = self.path.with_name(self.path.name + ".tmp")
                torch.save({"model": trainable_state(module), **self.best}, tmp)
                tmp.replace(self.path)
        return value

    def restore(self, module: torch.nn.Module, device) -> dict | None:
        """Put ``best.pt``'s weights into ``module``; returns which (None: none kept, or its file is gone)."""
        if self.measure is None or self.best is None or not self.path.exists():
            return None
        module.load_state_dict(torch.load(self.path, map_location=device, weights_only=True)["model"], strict=False)
        return dict(self.best)
