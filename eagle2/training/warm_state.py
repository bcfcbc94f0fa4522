"""The committed-size training state of ``resume_dir`` (``loop.Trainer.save_warm`` writes it), checked from its
files alone before anything resumes from it: ``resume.json`` whole JSON with every key the trainer writes,
``trainable.safetensors`` present with a whole header, and neither a git-LFS pointer (what a clone made
without git-lfs holds). Each problem is one ``WarmStateError`` line naming the file and what to do. Whether
the state belongs to this run (its fingerprint) is the trainer's check, once the run's data is known.
"""

from __future__ import annotations

import json
from pathlib import Path

from eagle2.heads.locations import check_safetensors_header, is_lfs_pointer


class WarmStateError(ValueError):
    """A ``resume_dir`` whose state cannot be resumed from, found from its files alone (one line naming the file)."""


WARM_STATE_KEYS = ("fingerprint", "step", "epoch", "batch", "tokens_trained", "curve")


def read_warm_state(folder: str | Path | None) -> dict | None:
    """``resume.json`` of ``folder`` once it and ``trainable.safetensors`` are checked (whole JSON with
    every key ``save_warm`` writes, no git-LFS pointer in place of a file, a whole safetensors header);
    None when there is no state. Needs no model: ``train_head.py`` calls it before the target loads."""
    state_path = Path(folder) / "resume.json" if folder else None
    if state_path is None or not state_path.exists():
        return None
    weights = state_path.parent / "trainable.safetensors"
    for path in (state_path, weights):
        if path.is_file() and is_lfs_pointer(path):
            raise WarmStateError(f"{path} is a git-LFS pointer, not the file (the clone was made without git-lfs): "
                                 "run `git lfs install && git lfs pull`, or set resume_dir=null to start afresh")
    try:
        state = json.loads(state_path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise WarmStateError(f"{state_path} is not JSON ({type(exc).__name__}: {exc}); delete {state_path.parent} "
                             "or set resume_dir=null to start afresh") from None
    missing = [k for k in WARM_STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise WarmStateError(f"{state_path} has no {', '.join(missing)}: not a state this trainer wrote; delete "
                             f"{state_path.parent} or set resume_dir=null to start afresh")
    if not weights.is_file():
        raise WarmStateError(f"{state_path.parent} has resume.json but no trainable.safetensors; delete it or set "
                             "resume_dir=null to start afresh")
    try:
        check_safetensors_header(weights, "resume_dir")
    except ValueError as exc:
        raise WarmStateError(str(exc)) from None
    return state
