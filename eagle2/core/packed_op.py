"""A oneDNN-packed bf16 linear that a compiled graph can call: the op ``eagle2::packed_linear``.

Inside ``torch.compile`` a bf16 ``F.linear`` on a CPU lowers to the stock matrix product, which streams the
weight at about half the bandwidth the packed oneDNN product reaches (one row of SmolLM2's shapes, one thread,
bf16-native AMD EPYC: 16-21 GB/s against 33-45 GB/s). Inductor packs weights itself only under weight freezing,
which embeds them in the graph as oneDNN tensors: such a graph bypasses inductor's disk cache (they cannot be
pickled), so every process compiles again (~55 s for SmolLM2 here). A oneDNN tensor cannot be a graph input
either. So the packed weights live here, in a table, and the graph calls an opaque op with the plain weight (for
its shape) and the table index: the graph holds no packed tensor, caches on disk, and each call costs ~8 us of
dispatch more than the eager packed linear (measured: 120 one-row 576x576 products, 4.29 against 3.32 ms).

``register(weight)`` packs a weight and returns its index; ``release(indices)`` drops entries (a
``weakref.finalize`` on their owner calls it). The index is a constant of the traced graph: a graph compiled in
another process calls the weight registered under the same index there, which is the one its module registered,
since the graph of a module bakes in its own indices.
"""

from __future__ import annotations

import itertools

import torch

_TABLE: dict[int, torch.Tensor] = {}
_NEXT = itertools.count()

_LIB = torch.library.Library("eagle2", "DEF")
_LIB.define("packed_linear(Tensor x, Tensor weight, Tensor? bias, int index) -> Tensor")


def _packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, index: int) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, _TABLE[index], bias, "none", [], "")


def _shape_only(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, index: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


_LIB.impl("packed_linear", _packed_linear, "CPU")
torch.library.register_fake("eagle2::packed_linear", _shape_only, lib=_LIB)


def register(weight: torch.Tensor) -> int:
    """Pack ``weight`` (out, in), bf16 on a CPU, for oneDNN; returns its index for ``linear``."""
    return adopt(torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None))


def adopt(packed: torch.Tensor) -> int:
    """Enter an already packed weight (``eagle2.core.kernels.PackedLinear``'s) in the table; returns its index."""
    index = next(_NEXT)
    _TABLE[index] = packed
    return index


def release(indices) -> None:
    for index in indices:
        _TABLE.pop(index, None)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, index: int | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, through the packed weight ``index`` when there is one."""
    if index is None:
        return torch.nn.functional.linear(x, weight, bias)
    return torch.ops.eagle2.packed_linear(x, weight, bias, index)
