"""The held-out curve of a training run: when it is flat (``curve_flat``, the trainer's stop) and its best
checkpoint by a held-out measure (``train.<section>.best_by``).

``last`` (the default) keeps nothing: the run exports its last weights. ``top1``, ``tau`` or ``loss``: each
validation that beats the best so far writes the trained weights to ``<out_dir>/best.pt``, and a finished run
ends with those weights in the module, so the export is the best checkpoint. ``tau`` is the greedy-chain tau of
``val_set: mtbench`` (the validation rows' ``chain_tau``): an EAGLE-3 head's tau can peak and then fall while its
loss keeps falling, so its checkpoint is chosen by tau. The trainer's flat-curve stop follows the same measure.

Several heads trained together (``eagle2.training.objectives.joint.JointHeads``, validated as ``name/<stat>``): the
run's best follows the primary head, and each member whose own measure the validation has gets its own best too
(``best_<name>.pt``, its weights alone), so a finished run exports every member at its own best validation; a
member the validation does not measure (no greedy chain to take tau with) takes the primary's best step.
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
        members = (self.best or {}).get("members", {})
        if self.best is None or value > self.best["value"]:
            self.best = {"step": step, "value": value, "by": stat}
            self._write(self.path, module, self.best)
        joint = getattr(module, "heads", None)  # a joint run's members (JointHeads), each by its own measure
        for name, head in (joint.items() if isinstance(joint, torch.nn.ModuleDict) else ()):
            if f"{name}/{stat}" in stats:
                mine = sign * float(stats[f"{name}/{stat}"])
                if name not in members or mine > members[name]["value"]:
                    members[name] = {"step": step, "value": mine}
                    self._write(self.member_path(name), head, members[name])
        if members:
            self.best["members"] = members
        return value

    def member_path(self, name: str) -> Path:
        return self.path.with_name(f"best_{name}.pt")

    @staticmethod
    def _write(path: Path, module: torch.nn.Module, record: dict) -> None:
        if distributed.is_main():
            tmp = path.with_name(path.name + ".tmp")
            torch.save({"model": trainable_state(module), **record}, tmp)
            tmp.replace(path)

    def restore(self, module: torch.nn.Module, device) -> dict | None:
        """Put ``best.pt``'s weights into ``module``, then each member's own best (``best_<name>.pt``) into that
        member; returns which (None: none kept, or its file is gone)."""
        if self.measure is None or self.best is None or not self.path.exists():
            return None
        module.load_state_dict(torch.load(self.path, map_location=device, weights_only=True)["model"], strict=False)
        for name in (self.best.get("members") or {}):
            state = torch.load(self.member_path(name), map_location=device, weights_only=True)["model"]
            module.heads[name].load_state_dict(state, strict=False)
        return dict(self.best)
