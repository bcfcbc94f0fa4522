"""Dtype names: ``model.dtype`` strings (``auto`` included) to torch dtypes, and the warning for bf16 on a
CPU without native bf16 (``eagle2.core.cpu``). Knows nothing about models."""

from __future__ import annotations

import logging

import torch

from eagle2.core.cpu import auto_dtype, cpu_has_native_bf16

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
          "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float64": torch.float64}  # float64: the identity audit's reference for fp32 runs


def resolve_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[str(name)]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(DTYPES)}") from None


def dtype_name(name: str) -> str:
    """The canonical name of a config dtype string: ``bf16`` -> ``bfloat16``, ``fp32`` -> ``float32``."""
    return str(resolve_dtype(name)).removeprefix("torch.")


def concrete_dtype(name: str, device: str = "cpu") -> str:
    """A ``model.dtype`` setting as a dtype name. ``auto`` picks the faster precision for speculation on
    ``device``: bf16 on GPUs and on CPUs that multiply bf16 natively, fp32 on other CPUs (there a bf16
    forward over a tree costs ~4 one-token forwards, fp32's ~2)."""
    return dtype_name(name) if str(name) != "auto" else auto_dtype(device)


def warn_if_slow_bf16(dtype: torch.dtype, device: str) -> None:
    if dtype == torch.bfloat16 and torch.device(device).type == "cpu" and cpu_has_native_bf16() is False:
        log.warning("this CPU has no native bf16 matrix instructions (no avx512_bf16 / amx_bf16): bf16 "
                    "tree verification is slow here; model.dtype=float32 may be faster for speculative methods")
