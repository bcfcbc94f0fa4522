"""What this CPU is, for the choices that depend on it: whether it multiplies bf16 natively, its kind (named
beside every speed figure, recorded in rows) and the dtype ``model.dtype=auto`` means on it. Imports no
torch: the results store hashes ``auto`` through it."""

from __future__ import annotations

import os
from pathlib import Path

# oneDNN's ISA names below its first bf16 one: ONEDNN_MAX_CPU_ISA=AVX2 (with ATEN_CPU_CAPABILITY=avx2) makes
# a bf16-native CPU compute as an AVX2-only one does, e.g. to predict that machine kind's costs
_ISAS_WITHOUT_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}


def cpu_has_native_bf16() -> bool | None:
    """Whether this CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX); None when unknown.

    Without it (e.g. AVX2 only) torch converts bf16 on the fly: a one-token forward is still cheaper
    than in fp32 (half the bytes to read), but a multi-token forward, such as a tree verification,
    costs several times more (`make bench-engine` measures it; docs/precision.md). An ``ONEDNN_MAX_CPU_ISA`` cap below
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


def auto_dtype(device: str = "cpu") -> str:
    """The faster precision for speculation on ``device``: bf16 on GPUs and on CPUs that multiply bf16
    natively, fp32 on other CPUs (there a bf16 forward over a tree costs ~4 one-token forwards, fp32's ~2)."""
    if not str(device).startswith("cpu"):
        return "bfloat16"
    return "bfloat16" if cpu_has_native_bf16() else "float32"
