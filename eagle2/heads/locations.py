"""Drafter-weight locations checked from the files alone, before any model loads: a file given for a
folder, a path that is neither a folder nor a possible hub id, a folder without its config or weights,
a git-LFS pointer in place of a file (what a clone made without git-lfs holds), a config that is not
JSON, a safetensors file whose header is not whole. Each is one ``WeightLocationError`` line naming the
config key and the path; the hub is named only for a location that could be a hub id (``owner/name``).
What needs the weights' contents (keys and shapes) is checked by the loaders.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from eagle2.heads.checkpoint import WEIGHT_FILES, WeightLocationError, could_be_hub_id

LFS_POINTER = b"version https://git-lfs"
OPTIONAL_FILES = ("draft_vocab.safetensors",)


def is_lfs_pointer(path: Path) -> bool:
    """A git-LFS pointer file (a few lines of text) where the file itself should be."""
    with open(path, "rb") as f:
        return f.read(len(LFS_POINTER)) == LFS_POINTER


def _lfs_error(path: Path, key: str) -> WeightLocationError:
    return WeightLocationError(f"{key}: {path} is a git-LFS pointer, not the file (the clone was made without "
                               "git-lfs): run `git lfs install && git lfs pull` in the clone")


def check_safetensors_header(path: Path, key: str) -> None:
    """The 8-byte header length and the JSON header of a safetensors file, within the file's size, and the file as
    long as its tensors' data (the largest end offset the header gives): a file cut anywhere is named."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        try:
            if not 0 < length <= size - 8:
                raise ValueError(f"header length {length} in a file of {size} bytes")
            header = json.loads(f.read(length))
            end = max((t["data_offsets"][1] for name, t in header.items() if name != "__metadata__"), default=0)
            if 8 + length + end != size:
                raise ValueError(f"its tensors need {8 + length + end} bytes, the file has {size}")
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise WeightLocationError(f"{key}: {path} is not a whole safetensors file ({exc}); it is damaged or "
                                      "was cut short: download or save it again") from None


def check_file(path: Path, key: str) -> None:
    """One file of a weights folder: not an LFS pointer; a config that is JSON; a whole safetensors header."""
    if is_lfs_pointer(path):
        raise _lfs_error(path, key)
    if path.suffix == ".json":
        try:
            json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise WeightLocationError(f"{key}: {path} is not JSON ({type(exc).__name__}: {exc})") from None
    elif path.suffix == ".safetensors":
        check_safetensors_header(path, key)


def check_weights_location(location: str | Path, key: str, weight_files=WEIGHT_FILES) -> None:
    """Raise one ``WeightLocationError`` line when local ``location`` cannot hold the weights of config key
    ``key`` (``model.head``, ...); a missing path that could be a hub id is left to the hub."""
    path = Path(location)
    if path.is_file():
        raise WeightLocationError(f"{key}={location} is a file; give the folder that holds config.json and "
                                  f"{weight_files[0]}" + (f" ({path.parent}?)" if path.name in weight_files else ""))
    if not path.exists():
        if could_be_hub_id(str(location)):
            return
        raise WeightLocationError(f"{key}={location}: no such folder (looked in the working directory and the "
                                  "project), and not a hub id (owner/name) either")
    config = path / "config.json"
    if not config.is_file():
        raise WeightLocationError(f"{key}={location}: the folder has no config.json (not a weights folder)")
    weights = next((path / name for name in weight_files if (path / name).is_file()), None)
    if weights is None:
        raise WeightLocationError(f"{key}={location}: the folder holds none of {', '.join(weight_files)}")
    for file in (config, weights, *(path / name for name in OPTIONAL_FILES if (path / name).is_file())):
        check_file(file, key)
