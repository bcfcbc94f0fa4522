"""The target features a draft head reads, beyond the last hidden state: hidden states entering chosen
decoder layers, captured by forward pre-hooks (no model code forked, nothing copied: a hook keeps a
reference to the tensor the layer receives).

EAGLE-3 fuses three of them: the inputs of layers 2, L//2 and L-3 (L decoder layers), as in the
authors' code; ``eagle3_layers`` names them and ``LayerTap`` captures them during any forward.
"""

from __future__ import annotations

import torch


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder layers of a transformers causal LM (``model.model.layers`` for Llama-style models)."""
    base = getattr(model, "base_model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__} has no decoder layers at base_model.layers")
    return layers


def eagle3_layers(num_layers: int) -> tuple[int, int, int]:
    """The layers whose inputs EAGLE-3 fuses: 2, L//2 and L-3 (i.e. the outputs of layers 1, L//2-1, L-4)."""
    if num_layers < 4:
        raise ValueError(f"EAGLE-3 features need a target with at least 4 layers, not {num_layers}")
    return 2, num_layers // 2, num_layers - 3


class LayerTap:
    """Captures, at every forward, the hidden states (B, Q, H) entering each of ``layers``.

    ``read()`` returns them concatenated along the feature axis (B, Q, len(layers) * H), in the order
    given, on ``device`` (default: the first named layer's input's): a target spread over several GPUs
    hands each layer its input on that layer's GPU. Use as a context manager (or call ``close``) so the
    hooks never outlive their user."""

    def __init__(self, model, layers, device=None):
        self.layers = tuple(int(i) for i in layers)
        self.device = device
        modules = decoder_layers(model)
        bad = [i for i in self.layers if not 0 <= i < len(modules)]
        if bad:
            raise ValueError(f"layers {bad} out of range for a model with {len(modules)} decoder layers")
        self.captured: dict[int, torch.Tensor] = {}
        self.handles = [modules[i].register_forward_pre_hook(self._hook(i), with_kwargs=True) for i in self.layers]

    def _hook(self, index: int):
        def capture(module, args, kwargs):
            self.captured[index] = args[0] if args else kwargs["hidden_states"]
        return capture

    def read(self) -> torch.Tensor:
        missing = [i for i in self.layers if i not in self.captured]
        if missing:
            raise RuntimeError(f"no forward has reached layers {missing} since the tap was installed")
        device = self.device if self.device is not None else self.captured[self.layers[0]].device
        return torch.cat([self.captured[i].to(device) for i in self.layers], dim=-1)

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        self.captured = {}

    def __enter__(self) -> "LayerTap":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
