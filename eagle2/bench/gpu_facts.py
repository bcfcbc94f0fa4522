"""What a GPU row says about its GPUs: their names, the NVIDIA driver and CUDA versions (``gpu_facts``),
and the peak memory over every GPU the run used (``peak_memory_mb``; ``reset_peak_memory`` starts a
config's count on all of them: a target spread by ``device_map: auto`` fills several).

On a CPU run ``gpu_facts`` is None and the peak is the process's max RSS.
"""

from __future__ import annotations

import shutil
import subprocess
from functools import lru_cache

import torch


def _cuda(device) -> bool:
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


@lru_cache(maxsize=1)
def driver_version() -> str | None:
    """The NVIDIA driver's version (``nvidia-smi``), None where it cannot be read."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


def gpu_facts(device) -> dict | None:
    """{names (one per visible GPU), driver, cuda (torch's build), torch} for a CUDA run, else None."""
    if not _cuda(device):
        return None
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"names": names, "driver": driver_version(), "cuda": torch.version.cuda, "torch": torch.__version__}


def reset_peak_memory(device) -> None:
    """Start this config's peak-memory count on every GPU (a sweep runs many configs in one process)."""
    if _cuda(device):
        for i in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(i)


def peak_memory_mb(device) -> float | None:
    """This config's peak: GPU memory allocated, summed over every GPU (each GPU's own peak), on CUDA;
    the process's max RSS on a CPU."""
    if torch.device(device).type == "cuda":
        return sum(torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count())) / 2**20
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    except ImportError:
        return None
