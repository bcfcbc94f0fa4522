"""Reading weight files safely and checking them strictly: shared by every drafter-weight loader.
Never runs pickled code (safetensors, or ``torch.load(weights_only=True)``); a file that cannot be read
so is one ``WeightFileError`` line naming it and saying what to do, never a hint to lift the safety.

Published checkpoints come in a few harmless variants that are accepted as they are: fp16 (or any
float dtype; the loaders cast), ``pytorch_model.bin`` instead of ``model.safetensors``, and rotary
``inv_freq`` buffers that older transformers saved with the weights (recomputed from the config, so
they are dropped with a note). Anything else missing, extra or mis-shaped is refused by name.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)


class ModelUnavailableError(RuntimeError):
    """Weights cannot be found locally or fetched; the message says how to fix it."""

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
ROTARY_BUFFER = "rotary_emb.inv_freq"  # saved by transformers < 4.3x; computed from the config today


class WeightFileError(ValueError):
    """A weight file that cannot be read safely: damaged, not a weight file, or a pickle that would run code."""


CONVERT_HINT = ("convert it to safetensors where its source is trusted (safetensors.torch.save_file of its "
                "state dict) or get a .safetensors copy from its publisher")


def load_weight_file(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of one ``.safetensors`` file or pickled ``.bin``/``.pt`` state dict, read without running
    code; any failure is one ``WeightFileError`` line naming the file and what to do."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError) as exc:
            raise WeightFileError(f"cannot read {path}: not a whole safetensors file ({_first_line(exc)}); it is "
                                  "damaged or was cut short: download or save it again") from None
    import pickle

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = f" (it calls {found.group(1)})" if found else ""
        raise WeightFileError(f"refused: {path} is a pickle, which can run code{what}; {CONVERT_HINT}") from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise WeightFileError(f"cannot read {path}: not a whole PyTorch weight file ({_first_line(exc)}); it "
                              "is damaged or was cut short: download or save it again") from None


def read_token_ids(path: str | Path) -> torch.Tensor:
    """The ``token_ids`` of a draft-vocabulary file, as int64 whatever width they were stored in."""
    return load_weight_file(path)["token_ids"].long()


def write_token_ids(token_ids: torch.Tensor, path: str | Path) -> None:
    """Store ``token_ids`` as a draft-vocabulary file (``token_ids``), int32: every vocabulary fits, and the
    file is half the bytes of int64 (the heads are tracked under a size budget)."""
    from safetensors.torch import save_file

    if token_ids.numel() and int(token_ids.max()) >= 2**31:
        raise ValueError(f"token id {int(token_ids.max())} does not fit a draft-vocabulary file (int32)")
    save_file({"token_ids": token_ids.to(torch.int32).contiguous()}, str(path))


def write_checkpoint(folder: str | Path, config: dict, state: dict[str, torch.Tensor], dtype: torch.dtype | None = None,
                     weight_file: str = WEIGHT_FILES[0]) -> Path:
    """Write ``config.json`` and ``weight_file`` (``state``, its float tensors in ``dtype``, integer and boolean ones
    as they are) into ``folder``, made when missing; returns the folder."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2, default=str))
    save_file({k: v.detach().to(dtype if dtype and v.is_floating_point() else v.dtype).contiguous()
               for k, v in state.items()}, str(folder / weight_file))
    return folder


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160]}" if text else type(exc).__name__


def read_weights(folder: Path, names: tuple[str, ...] = WEIGHT_FILES) -> dict[str, torch.Tensor]:
    """The state dict in ``folder``: the first of ``names`` there (``model.safetensors``, else
    ``pytorch_model.bin``)."""
    for name in names:
        if (folder / name).is_file():
            return load_weight_file(folder / name)
    raise FileNotFoundError(f"{folder} holds none of {', '.join(names)}")


def drop_rotary_buffers(what: str, state: dict[str, torch.Tensor]) -> list[str]:
    """Remove saved rotary ``inv_freq`` buffers from ``state`` (with a note); return their names."""
    dropped = sorted(k for k in state if k.endswith(ROTARY_BUFFER))
    for key in dropped:
        del state[key]
    if dropped:
        log.info("%s: ignoring %d saved rotary buffer(s) (%s): recomputed from the config", what, len(dropped),
                 dropped[0] if len(dropped) == 1 else f"{dropped[0]} ... {dropped[-1]}")
    return dropped


def check_state(what: str, state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                optional: set[str] = frozenset()) -> None:
    """Raise naming the key when ``state`` misses, adds or mis-shapes a key of ``expected``."""
    missing = sorted(set(expected) - set(state) - set(optional))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise KeyError(f"{what}: missing keys {missing}, unexpected keys {unexpected}")
    for key, value in state.items():
        if value.shape != expected[key].shape:
            raise ValueError(f"{what}: {key} has shape {tuple(value.shape)}, expected {tuple(expected[key].shape)}")


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class WeightLocationError(ValueError):
    """A drafter-weight location that cannot hold loadable weights, found from its files alone."""


def could_be_hub_id(location: str) -> bool:
    """``owner/name`` and nothing that only a local path has (a leading ``.``, ``/`` or ``~``, more parts)."""
    return bool(HUB_ID.match(location)) and not location.startswith((".", "~"))


def checkpoint_folder(location: str, what: str, config_key: str, files=("config.json", *WEIGHT_FILES)) -> Path:
    """``location`` as a local folder, or the hub snapshot of that id (only ``files``, glob patterns). A hub
    failure becomes one clear line naming ``what`` and the config key to pass a local folder with."""
    path = Path(location)
    if path.is_dir():
        return path
    if path.is_file() or not could_be_hub_id(str(location)):  # eagle2.heads.locations says which, in one line
        what = "a file, not a folder" if path.is_file() else "no such folder, and not a hub id (owner/name) either"
        raise WeightLocationError(f"{config_key}={location}: {what}")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(location, allow_patterns=list(files)))
    except Exception as exc:  # noqa: BLE001 - any hub failure becomes one clear line
        raise ModelUnavailableError(
            f"cannot load {what} {location!r}: not a local folder and the hub is unreachable "
            f"({type(exc).__name__}); download it and pass {config_key}=/local/dir") from None


def weights_fingerprint(location: str | Path) -> str | None:
    """A short content hash of a local weights folder (its config and weight files) or file; None for
    a hub id, whose files are not here to hash. Rows record it, so results of two different heads stored
    under one path (a head re-trained in place) are told apart."""
    import hashlib

    path = Path(location)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".json", ".safetensors", ".bin", ".pt")
                       and p.name not in ("eval.json", "training.json"))  # the weights, not the reports about them
    elif path.is_file():
        files = [path]
    else:
        return None
    digest = hashlib.sha1()
    for file in files:
        digest.update(file.name.encode())
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()[:12]


def cast_like_target(module: torch.nn.Module, target) -> torch.nn.Module:
    """``module`` on the target's device and in its dtype, with rotary ``inv_freq`` tables kept in fp32 as
    transformers keeps the target's own (rounding them to half precision shifts every rotary angle)."""
    tables = {name: buf.detach().float().clone() for name, buf in module.named_buffers() if name.endswith("inv_freq")}
    module.to(target.device, target.dtype)
    for name, table in tables.items():
        owner, _, attr = name.rpartition(".")
        module.get_submodule(owner)._buffers[attr] = table.to(target.device)
    return module


def shared_or_own_embedding(what: str, embed: torch.Tensor | None, target) -> nn.Module:
    """A head's token embedding: the target's own module when the checkpoint has none, or holds a copy
    equal to it at the target's dtype (the authors' heads store their frozen copy of the target's: no
    second copy in memory, 2 GB at Llama-3-70B); else the checkpoint's, frozen, on the target's device."""
    mine = target.get_input_embeddings()
    if embed is None:
        return mine
    weight = mine.weight
    if tuple(embed.shape) == tuple(weight.shape) and _equal_in_chunks(embed, weight):
        return mine
    log.info("%s: its embed_tokens.weight differs from the target's embedding: the head keeps its own", what)
    own = nn.Embedding.from_pretrained(embed, freeze=True)
    return own.to(weight.device, weight.dtype)


def _equal_in_chunks(embed: torch.Tensor, weight: torch.Tensor, rows: int = 8192) -> bool:
    """``embed`` (any dtype, any device) equals ``weight`` once cast to its dtype; one slice at a time."""
    return all(torch.equal(embed[i:i + rows].to(weight.device, weight.dtype), weight[i:i + rows])
               for i in range(0, embed.shape[0], rows))
