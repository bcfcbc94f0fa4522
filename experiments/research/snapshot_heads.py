"""A running training's heads as loadable head folders, to measure them mid-run (MT-bench tau along a long run).

A long run exports its heads only when it finishes; its committed-size resume state (``train.*.resume_dir``:
``trainable.safetensors``, the trained weights in bf16 under the module's names, and ``resume.json``) holds them
at every checkpoint. This loads each head the run started from (``--init NAME=FOLDER``: the head's weights
prefix in the state, e.g. ``eagle3``, and the folder its run was initialised from, for the architecture and
the draft vocabulary), puts the state's weights in it (strictly: every tensor must match), and saves it as a head
folder under ``--out/NAME``, stamped with the step and tokens in ``snapshot.json``.

    python -m experiments.research.snapshot_heads --state artifacts/smollm2/train_state/joint \\
        --init eagle3=artifacts/smollm2/eagle3_head --init head=artifacts/smollm2/eagle_head --out /tmp/step900
    python run.py method=eagle3 model.eagle3_head=/tmp/step900/eagle3 dataset.limit=5
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from eagle2.heads.eagle3_head import Eagle3Head, load_eagle3_head, save_eagle3_head
from eagle2.heads.eagle_head import load_head, save_head
from experiments.bench.bench_engine import smollm2


def snapshot(state: Path, name: str, init: Path, target, out: Path) -> Path:
    """Save head ``name`` of the resume ``state`` (initialised like ``init``) under ``out / name``."""
    prefix = f"heads.{name}."
    weights = {k[len(prefix):]: v for k, v in load_file(str(state / "trainable.safetensors")).items()
               if k.startswith(prefix)}
    if not weights:
        raise SystemExit(f"{state}: no weights under {prefix!r}")
    head = (load_eagle3_head if _is_eagle3(init) else load_head)(init, target)
    own = head.state_dict()
    missing = [k for k in weights if k not in own]
    if missing:
        raise SystemExit(f"{state}: {len(missing)} tensors of {name!r} are not in {init}'s head: {missing[:3]}")
    with torch.no_grad():
        for key, value in weights.items():
            own[key].copy_(value.to(own[key].dtype))
    folder = out / name
    (save_eagle3_head if isinstance(head, Eagle3Head) else save_head)(head, folder, dtype=torch.bfloat16)
    position = json.loads((state / "resume.json").read_text())
    (folder / "snapshot.json").write_text(json.dumps(
        {"state": str(state), "step": position["step"], "tokens_trained": position["tokens_trained"],
         "tensors": len(weights), "of": len(own)}, indent=1))
    return folder


def _is_eagle3(folder: Path) -> bool:
    return any("Eagle3" in name for name in json.loads((folder / "config.json").read_text()).get("architectures", []))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", required=True, type=Path)
    ap.add_argument("--init", action="append", required=True, help="NAME=FOLDER (repeatable)")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    _, target, _ = smollm2("float32", "stock")
    for item in args.init:
        name, _, folder = item.partition("=")
        print(snapshot(args.state, name, Path(folder), target, args.out))


if __name__ == "__main__":
    main()
