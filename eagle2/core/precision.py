"""Dtype names and the CPU's bf16 ability: ``model.dtype`` strings to torch dtypes, and whether this CPU
multiplies bf16 natively (which decides where half precision pays). Knows nothing about models."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

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


def cpu_has_native_bf16() -> bool | None:
    """Whether this CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX); None when unknown.

    Without it (e.g. AVX2 only) torch converts bf16 on the fly: a one-token forward is still cheaper
    than in fp32 (half the bytes to read), but a multi-token forward, such as a tree verification,
    costs several times more (measured in README, "Precision")."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return None
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def warn_if_slow_bf16(dtype: torch.dtype, device: str) -> None:
    if dtype == torch.bfloat16 and torch.device(device).type == "cpu" and cpu_has_native_bf16() is False:
        log.warning("this CPU has no native bf16 matrix instructions (no avx512_bf16 / amx_bf16): bf16 "
                    "tree verification is slow here; model.dtype=float32 may be faster for speculative methods")
