"""What of a trained module is stored: its checkpointed state (the target's shared weights left out), and its
export (a weights folder in its format, its dtype, its size limit, the ``training.json`` card beside it)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

SHARED_KEYS = ("model.embed_tokens.weight", "lm_head.weight")  # the target's, never stored with a drafter


def trainable_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint stores: everything but rotary buffers and the target's shared weights (a module
    with its own LM head, such as an EAGLE-3 head, says so with ``shared_keys = ()``)."""
    shared = getattr(module, "shared_keys", SHARED_KEYS)
    return {k: v for k, v in module.state_dict().items() if k not in shared and "rotary" not in k}


EXPORT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def export_dtype(module: torch.nn.Module, max_mb: float, dtype: str = "auto") -> torch.dtype:
    """The dtype an export stores: ``dtype`` as configured (``train.export.dtype``: bfloat16, float16,
    float32), or for ``auto`` fp32 if the stored weights fit in ``max_mb`` MB, else fp16."""
    if dtype != "auto":
        if dtype not in EXPORT_DTYPES:
            raise ValueError(f"export dtype {dtype!r}: expected auto or one of {sorted(EXPORT_DTYPES)}")
        return EXPORT_DTYPES[dtype]
    numel = sum(v.numel() for v in trainable_state(module).values())
    return torch.float32 if numel * 4 <= max_mb * 1e6 else torch.float16


def export(module: torch.nn.Module, family, summary: dict, cfg, root: Path, *, kind: str, export_key: str,
           section: str | None = None) -> Path:
    """Store a trained ``module`` in its drafter ``family``'s format (``family.save``) at
    ``train.export.<export_key>`` (under ``train.export.<export_key>_max_mb``, in ``train.export.dtype``), with its
    card ``training.json``: the corpus and recipe settings (``train.<section>``, default ``train.<kind>``), the
    shards the trainer read, the summary."""
    from omegaconf import OmegaConf

    max_mb, section = cfg.train.export[f"{export_key}_max_mb"], section or kind
    dtype = export_dtype(module, max_mb, cfg.train.export.get("dtype", "bfloat16"))
    folder = Path(family.save(module, root / cfg.train.export[export_key], dtype=dtype))
    size = (folder / "model.safetensors").stat().st_size / 1e6
    if size > max_mb:
        raise RuntimeError(f"{folder}/model.safetensors is {size:.1f} MB, over the {max_mb} MB limit")
    summary = dict(summary)
    info = {"kind": kind, "target": cfg.model.name, "corpus": OmegaConf.to_container(cfg.train.corpus),
            "corpus_shards": summary.pop("corpus_shards"), **({"trained_in": section} if section != kind else {}),
            "recipe": OmegaConf.to_container(cfg.train[section]), "stored_dtype": str(dtype).replace("torch.", ""),
            "summary": summary}
    (folder / "training.json").write_text(json.dumps(info, indent=2, default=str))
    return folder
