"""Reading weight files safely and checking them strictly: shared by the EAGLE-head and SpS-draft
loaders. Never runs pickled code (safetensors, or ``torch.load(weights_only=True)``)."""

from __future__ import annotations

from pathlib import Path

import torch

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The state dict in ``folder``: ``model.safetensors`` if present, else ``pytorch_model.bin``."""
    st, pt = folder / WEIGHT_FILES[0], folder / WEIGHT_FILES[1]
    if st.is_file():
        from safetensors.torch import load_file

        return load_file(str(st))
    if pt.is_file():
        return torch.load(pt, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{folder} holds neither {WEIGHT_FILES[0]} nor {WEIGHT_FILES[1]}")


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
