"""The committed-size training state of ``resume_dir``: written at every checkpoint (``write_warm_state``),
checked from its files alone before anything resumes from it (``read_warm_state``), and put back into the
module (``load_warm_weights``).

The state is ``resume.json`` (fingerprint, position, tokens, curve and ``weights_sha256``, the digest of the
bf16 weights), ``trainable.safetensors`` (those weights) and ``metrics.jsonl.gz`` (the run's metrics rows; a
state written before it kept them in ``resume.json``'s ``rows``, still read). A run whose weights were promoted
into the heads it starts from (``experiments.research.snapshot_heads --promote``) commits ``resume.json`` and
its rows alone: it resumes from its ``init_from`` heads once their digest matches. A state whose weights are
neither promoted nor in the tree resumes once ``trainable.safetensors`` is restored from the commit that holds
it. The checks: ``resume.json`` whole JSON with every key the trainer writes, the weights present (or a digest
to check them by) with a whole header, the rows whole gzipped JSON lines, and no git-LFS pointer (what a clone
made without git-lfs holds). Each problem is one ``WarmStateError`` line naming the file and what to do. Whether
the state belongs to this run (its fingerprint) is the trainer's check, once the run's data is known.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import torch

from eagle2.heads.locations import check_safetensors_header, is_lfs_pointer
from eagle2.training.support.models import trainable_state


class WarmStateError(ValueError):
    """A ``resume_dir`` whose state cannot be resumed from, found from its files alone (one line naming the file)."""


WEIGHTS_FILE = "trainable.safetensors"
ROWS_FILE = "metrics.jsonl.gz"
WARM_STATE_KEYS = ("fingerprint", "step", "epoch", "batch", "tokens_trained", "curve")


def read_warm_state(folder: str | Path | None) -> dict | None:
    """``resume.json`` of ``folder`` once it and ``trainable.safetensors`` are checked (whole JSON with
    every key ``save_warm`` writes, no git-LFS pointer in place of a file, a whole safetensors header);
    None when there is no state. Needs no model: ``train_head.py`` calls it before the target loads."""
    state_path = Path(folder) / "resume.json" if folder else None
    if state_path is None or not state_path.exists():
        return None
    weights, rows = state_path.parent / WEIGHTS_FILE, state_path.parent / ROWS_FILE
    for path in (state_path, weights, rows):
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
    if rows.is_file():
        try:
            warm_rows(state_path.parent, state)
        except (OSError, EOFError, ValueError, UnicodeDecodeError) as exc:
            raise WarmStateError(f"{rows} is not gzipped JSON lines ({type(exc).__name__}: {exc}); restore it "
                                 "from the commit that holds it, or set resume_dir=null to start afresh") from None
    if not weights.is_file():
        if state.get("weights_sha256"):  # promoted into the init heads: the trainer checks them by the digest
            return state
        raise WarmStateError(f"{state_path.parent} has resume.json but no trainable.safetensors; delete it or set "
                             "resume_dir=null to start afresh")
    try:
        check_safetensors_header(weights, "resume_dir")
    except ValueError as exc:
        raise WarmStateError(str(exc)) from None
    return state


def warm_rows(folder: str | Path, state: dict) -> list[dict]:
    """The metrics rows of the state in ``folder``: ``metrics.jsonl.gz``, else ``resume.json``'s ``rows``."""
    path = Path(folder) / ROWS_FILE
    if not path.is_file():
        return list(state.get("rows", []))
    return [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines() if line.strip()]


def warm_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights a warm state keeps: every floating tensor of ``models.trainable_state``, in bf16."""
    return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in trainable_state(module).items()
            if v.is_floating_point()}


def weights_digest(weights: dict[str, torch.Tensor]) -> str:
    """sha256 over ``weights`` in key order: each name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for key in sorted(weights):
        tensor = weights[key].contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def write_warm_state(folder: str | Path, module: torch.nn.Module, state: dict, rows: list[dict]) -> None:
    """Write ``module``'s warm weights, the metrics ``rows`` (gzipped, byte-stable: no time stamp) and ``state``
    (with the weights' digest, ``weights_sha256``) to ``folder``, atomically per file."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = warm_weights(module)
    save_file(weights, str(folder / f"{WEIGHTS_FILE}.tmp"))
    os.replace(folder / f"{WEIGHTS_FILE}.tmp", folder / WEIGHTS_FILE)
    lines = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (folder / f"{ROWS_FILE}.tmp").write_bytes(gzip.compress(lines, compresslevel=9, mtime=0))
    os.replace(folder / f"{ROWS_FILE}.tmp", folder / ROWS_FILE)
    (folder / "resume.json.tmp").write_text(json.dumps({**state, "weights_sha256": weights_digest(weights)}) + "\n")
    os.replace(folder / "resume.json.tmp", folder / "resume.json")


def load_warm_weights(folder: str | Path, module: torch.nn.Module, state: dict) -> None:
    """Give ``module`` the warm state's weights: from ``trainable.safetensors``; or, where the state's weights
    were promoted into the heads the run starts from (``experiments.research.snapshot_heads --promote``: only
    ``resume.json`` is committed), check that ``module`` already holds them (the same ``weights_sha256``)."""
    path = Path(folder) / WEIGHTS_FILE
    if not path.is_file():
        held = weights_digest(warm_weights(module))
        if held != state.get("weights_sha256"):
            raise WarmStateError(f"{folder} has no {WEIGHTS_FILE} and the heads this run starts from (init_from) "
                                 f"are not its weights (sha256 {held[:12]}, the state's "
                                 f"{str(state.get('weights_sha256'))[:12]}): point init_from at the promoted heads, "
                                 f"restore {WEIGHTS_FILE} from the commit that holds it (git log -- "
                                 f"{Path(folder) / WEIGHTS_FILE}), or set resume_dir=null to start afresh")
        return
    from safetensors.torch import load_file

    weights = load_file(str(path))
    own = module.state_dict()
    module.load_state_dict({k: v.to(own[k].dtype) for k, v in weights.items()}, strict=False)
