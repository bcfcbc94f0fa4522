"""A running training's heads as loadable head folders, to measure them mid-run (MT-bench tau along a long run).

A long run exports its heads only when it finishes; its committed-size resume state (``train.*.resume_dir``:
``trainable.safetensors``, the trained weights in bf16 under the module's names, and ``resume.json``) holds them
at every checkpoint. This loads each head the run started from (``--init NAME=FOLDER``: the head's weights
prefix in the state, e.g. ``eagle3``, and the folder its run was initialised from, for the architecture and
the draft vocabulary), puts the state's weights in it (strictly: every tensor must match), and saves it as a head
folder under ``--out/NAME``, stamped with the step and tokens in ``snapshot.json``.

``--promote`` writes each head into its ``--init`` folder instead, checks that the heads reloaded from there
hold exactly the state's weights (their digest, ``warm_state.weights_digest``) and records the digest in the
state's ``resume.json``; each head's ``training.json`` then names the state, step and tokens its weights come
from (the card of the head it replaced kept inside it), and its stale ``eval.json`` goes. The state's weights
then live in the heads the run starts from, so ``resume.json`` and its rows alone are committed and the next
sitting resumes from it (``warm_state.load_warm_weights``). ``--init`` for some of the state's heads promotes
those alone (one head measured better, the other not): the state's weights must then be kept to resume.

    python -m experiments.research.snapshot_heads --state artifacts/smollm2/train_state/joint \\
        --init eagle3=artifacts/smollm2/eagle3_head --init head=artifacts/smollm2/eagle_head --out /tmp/step900
    python run.py method=eagle3 model.eagle3_head=/tmp/step900/eagle3 dataset.limit=5
    python -m experiments.research.snapshot_heads --state artifacts/smollm2/train_state/joint \\
        --init eagle3=artifacts/smollm2/eagle3_head --init head=artifacts/smollm2/eagle_head --promote
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from eagle2.heads.eagle3_head import Eagle3Head, load_eagle3_head, save_eagle3_head
from eagle2.heads.eagle_head import load_head, save_head
from eagle2.training.support.warm_state import ROWS_FILE, WEIGHTS_FILE, weights_digest
from experiments.bench.side_by_side import smollm2

ROOT = Path(__file__).resolve().parents[2]


def snapshot(state: Path, prefix: str, init: Path, target, folder: Path, stored: dict | None = None) -> Path:
    """Save the head whose weights carry ``prefix`` in the resume ``state`` (``heads.eagle3.`` in a joint run's,
    ``""`` in a one-head run's), initialised like ``init``, as the head folder ``folder`` (``stored``: the
    state's weights when the caller has loaded them already)."""
    stored = load_file(str(state / WEIGHTS_FILE)) if stored is None else stored
    weights = {k[len(prefix):]: v for k, v in stored.items() if k.startswith(prefix)}
    if not weights:
        raise SystemExit(f"{state}: no weights under {prefix!r}")
    head = _load(init, target)
    own = head.state_dict()
    missing = [k for k in weights if k not in own]
    if missing:
        raise SystemExit(f"{state}: {len(missing)} tensors of {prefix!r} are not in {init}'s head: {missing[:3]}")
    with torch.no_grad():
        for key, value in weights.items():
            own[key].copy_(value.to(own[key].dtype))
    (save_eagle3_head if isinstance(head, Eagle3Head) else save_head)(head, folder, dtype=torch.bfloat16)
    if Path(folder).resolve() == Path(init).resolve():  # promoted: its training.json says where it comes from
        return folder
    position = json.loads((state / "resume.json").read_text())
    (folder / "snapshot.json").write_text(json.dumps(
        {"state": str(state), "step": position["step"], "tokens_trained": position["tokens_trained"],
         "tensors": len(weights), "of": len(own)}, indent=1))
    return folder


def promote(state: Path, inits: dict[str, Path], target) -> str:
    """Write each head of ``state`` into its ``inits`` folder (``{prefix: folder}``), check that the heads
    reloaded from there hold exactly the state's weights, and record their digest in ``resume.json``. With
    ``inits`` naming only some of the state's heads, those alone are promoted (their cards carry the digest of
    their weights alone) and ``resume.json`` is left as it is: the other heads' weights are not in the heads
    the run starts from, so resuming still needs the state's ``trainable.safetensors``."""
    stored = load_file(str(state / WEIGHTS_FILE))
    promoted = {k: v for k, v in stored.items() if k.startswith(tuple(inits))}
    for prefix, folder in inits.items():
        snapshot(state, prefix, folder, target, folder, stored)
    reloaded = {}
    for prefix, folder in inits.items():
        own = _load(folder, target).state_dict()
        reloaded |= {prefix + k: own[k].to(torch.bfloat16) for k in own if prefix + k in promoted}
    digest = weights_digest(promoted)
    if set(reloaded) != set(promoted) or weights_digest({k: reloaded[k] for k in promoted}) != digest:
        raise SystemExit(f"{state}: the promoted heads do not reload as the state's weights; nothing recorded")
    position = json.loads((state / "resume.json").read_text())
    for folder in inits.values():
        write_card(folder, state, position, digest)
    if len(promoted) == len(stored):
        (state / "resume.json").write_text(json.dumps({**position, "weights_sha256": digest}) + "\n")
    return digest


def write_card(folder: Path, state: Path, position: dict, digest: str) -> None:
    """Rewrite ``folder``'s ``training.json`` for its promoted weights: where they come from (the state, its
    step and tokens, the weights' digest), the card of the head they were trained from kept under
    ``continued_from``. The head's ``eval.json`` measured the weights it replaces: it is removed (the eval
    stage writes it again)."""
    card = folder / "training.json"
    previous = json.loads(card.read_text()) if card.is_file() else None
    kind = (previous or {}).get("kind", "eagle3" if _is_eagle3(folder) else "head")
    card.write_text(json.dumps({
        "kind": kind, "target": (previous or {}).get("target"),
        "promoted_from": {"state": _shown(state), "step": position["step"], "epoch": position["epoch"],
                          "tokens_trained": position["tokens_trained"], "weights_sha256": digest,
                          "rows": _shown(state / ROWS_FILE), "date": f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d}"},
        "continued_from": previous}, indent=2, default=str))
    (folder / "eval.json").unlink(missing_ok=True)


def _shown(path: Path) -> str:
    """``path`` relative to the repository when inside it (a card names files of the checkout)."""
    try:
        return Path(path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def _load(folder: Path, target):
    return (load_eagle3_head if _is_eagle3(folder) else load_head)(folder, target)


def _is_eagle3(folder: Path) -> bool:
    return any("Eagle3" in name for name in json.loads((folder / "config.json").read_text()).get("architectures", []))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", required=True, type=Path)
    ap.add_argument("--init", action="append", required=True, help="NAME=FOLDER (repeatable)")
    ap.add_argument("--out", type=Path, help="the folder the snapshots go under (NAME each)")
    ap.add_argument("--promote", action="store_true", help="write each head into its --init folder instead")
    args = ap.parse_args()
    if bool(args.out) == args.promote:
        ap.error("give --out or --promote")
    _, target, _ = smollm2("float32", "stock")
    inits = {f"heads.{name}.": Path(folder) for name, _, folder in (item.partition("=") for item in args.init)}
    if args.promote:
        digest = promote(args.state, inits, target)
        print(f"{args.state}: promoted into {', '.join(map(str, inits.values()))}; weights sha256 {digest}")
        return
    for prefix, folder in inits.items():
        print(snapshot(args.state, prefix, folder, target, args.out / prefix.split(".")[1]))


if __name__ == "__main__":
    main()
