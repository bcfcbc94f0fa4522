"""Rewrite the shipped drafters' safetensors in bf16, in place, so that the tracked tree travels (issue 27).

Every floating tensor but rotary ``inv_freq`` tables (kept fp32) is stored as bfloat16; integer tensors
(draft vocabularies) and each file's metadata are kept; ``dtype`` / ``torch_dtype`` fields of the folder's
config.json become "bfloat16". The loaders cast a bf16 file to the target's dtype (eagle2/heads/checkpoint.py).

    python -m experiments.ship_bf16 [--root artifacts/smollm2] [--drafters eagle_head eagle3_head ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

DRAFTERS = ("eagle_head", "eagle3_head", "sps_draft", "medusa_head")


def to_bf16(path: Path) -> tuple[int, int]:
    """Rewrite one safetensors file; (bytes before, bytes after)."""
    before = path.stat().st_size
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    for name, t in tensors.items():
        if t.is_floating_point() and not name.endswith("inv_freq"):
            tensors[name] = t.to(torch.bfloat16).contiguous()
    save_file(tensors, str(path), metadata=metadata)
    return before, path.stat().st_size


def mark_config(folder: Path) -> None:
    config = folder / "config.json"
    if not config.exists():
        return
    data = json.loads(config.read_text())
    keys = [k for k in ("dtype", "torch_dtype") if k in data]
    if keys:
        data.update({k: "bfloat16" for k in keys})
        config.write_text(json.dumps(data, indent=2) + "\n")


def ship(root: Path, drafters=DRAFTERS) -> None:
    for name in drafters:
        folder = root / name
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no such drafter folder")
        for path in sorted(folder.glob("*.safetensors")):
            before, after = to_bf16(path)
            print(f"{path}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
        mark_config(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("artifacts/smollm2"))
    parser.add_argument("--drafters", nargs="+", default=list(DRAFTERS))
    args = parser.parse_args()
    ship(args.root, args.drafters)


if __name__ == "__main__":
    main()
