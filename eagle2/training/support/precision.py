"""The dtype a training forward runs in under autocast (``train.<section>.autocast``): one rule for the
heads' training step (``loop``) and the target's online features (``features``)."""

from __future__ import annotations

import torch

from eagle2.core.cpu import cpu_has_native_bf16


def autocast_dtype(setting: str | None, device: torch.device) -> torch.dtype | None:
    """The training forward's autocast dtype: ``auto`` = bf16 on a CPU that multiplies bf16 natively
    (and on CUDA), None (fp32) elsewhere; ``bf16`` always; ``off`` never."""
    setting = str(setting or "auto").lower()
    if setting not in ("auto", "bf16", "off"):
        raise ValueError(f"train.*.autocast must be auto, bf16 or off, not {setting!r}")
    if setting == "off":
        return None
    if setting == "bf16" or device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16()):
        return torch.bfloat16
    return None
