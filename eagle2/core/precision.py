"""Dtype names and the CPU's bf16 ability: ``model.dtype`` strings to torch dtypes, and whether this CPU
multiplies bf16 natively (which decides where half precision pays). Knows nothing about models."""

from __future__ import annotations

import logging
import os
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


# oneDNN's ISA names below its first bf16 one: ONEDNN_MAX_CPU_ISA=AVX2 (with ATEN_CPU_CAPABILITY=avx2) makes
# a bf16-native CPU compute as an AVX2-only one does, e.g. to predict that machine kind's costs
_ISAS_WITHOUT_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}


def cpu_has_native_bf16() -> bool | None:
    """Whether this CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX); None when unknown.

    Without it (e.g. AVX2 only) torch converts bf16 on the fly: a one-token forward is still cheaper
    than in fp32 (half the bytes to read), but a multi-token forward, such as a tree verification,
    costs several times more (measured in README, "Precision"). An ``ONEDNN_MAX_CPU_ISA`` cap below
    the bf16 instructions counts as their absence."""
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in _ISAS_WITHOUT_BF16:
        return False
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return None
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def cpu_kind() -> str:
    """``bf16-native`` (AVX512-BF16 / AMX), ``avx2`` (no native bf16) or ``unknown``: named beside every
    speed figure and recorded in rows."""
    native = cpu_has_native_bf16()
    return "unknown" if native is None else "bf16-native" if native else "avx2"


def warn_if_slow_bf16(dtype: torch.dtype, device: str) -> None:
    if dtype == torch.bfloat16 and torch.device(device).type == "cpu" and cpu_has_native_bf16() is False:
        log.warning("this CPU has no native bf16 matrix instructions (no avx512_bf16 / amx_bf16): bf16 "
                    "tree verification is slow here; model.dtype=float32 may be faster for speculative methods")
