"""The fast kernels of each CPU, chosen when a model is loaded, by replacing modules (never the model code).

On a CPU that multiplies bf16 natively (AVX512-BF16 / AMX), a bf16 ``nn.Linear`` with its weight as
stored pays a layout conversion on every call; the same weight reordered once for oneDNN
(``torch.ops.mkldnn._reorder_linear_weight``) and applied with ``_linear_pointwise`` costs about half as
much per call at 1-17 rows with the weight in cache, and the same results; SmolLM2's whole bf16 forward
gets faster (`make bench-engine` measures it). ``accelerate(model, "auto")`` swaps
every bf16 CPU linear of ``model`` for a ``PackedLinear`` there and leaves every other model as it is
(fp32 goes through MKL, GPUs through cuBLAS: nothing to gain). ``compile=True`` instead wraps the model's
forward in ``torch.compile`` (inductor with weight freezing, which packs the weights itself; minutes of
compile on a CPU).
"""

from __future__ import annotations

import functools
import logging
import weakref

import torch
from torch import nn

from eagle2.core import packed_op
from eagle2.core.cpu import cpu_has_native_bf16

log = logging.getLogger(__name__)
KERNELS = ("auto", "packed", "stock")


@functools.cache
def packing_available() -> bool:
    """Whether this torch and this CPU can pack a bf16 linear for oneDNN: the op exists, and oneDNN's bf16
    path accepts the CPU (it refuses one without AVX512BW/VL/DQ or AVX-NE-CONVERT, e.g. AVX2-only CPUs);
    probed once on a tiny weight."""
    ops = getattr(torch.ops, "mkldnn", None)
    if not (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise")):
        return False
    try:
        packed = ops._reorder_linear_weight(torch.zeros(8, 8, dtype=torch.bfloat16), None)
        ops._linear_pointwise(torch.zeros(1, 8, dtype=torch.bfloat16), packed, None, "none", [], "")
    except RuntimeError:
        return False
    return True


class PackedLinear(nn.Module):
    """A bf16 CPU linear whose weight is reordered once for oneDNN. ``weight`` / ``bias`` stay the
    original tensors (readers such as a drafting LM-head copy or a tied embedding see them unchanged)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None),
                             persistent=False)
        self.index = packed_op.adopt(self.packed)  # what a compiled graph calls (it cannot hold a oneDNN tensor)
        weakref.finalize(self, packed_op.release, [self.index])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():  # the packed op has no backward (the gradient would miss ``weight``) and
            return nn.functional.linear(x, self.weight, self.bias)  # under autograd it ran ~90x slower, measured
        if torch.compiler.is_compiling():  # traced into a graph: the opaque op (eagle2.core.packed_op)
            return packed_op.linear(x, self.weight, self.bias, self.index)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN-packed"


def wants_packing(model: nn.Module, kernels: str = "auto") -> bool:
    """Whether ``kernels`` (auto | packed | stock) packs this model's linears."""
    if kernels not in KERNELS:
        raise ValueError(f"unknown kernels {kernels!r}; choose one of {', '.join(KERNELS)}")
    param = next(model.parameters(), None)
    eligible = (param is not None and param.device.type == "cpu" and param.dtype == torch.bfloat16
                and packing_available())
    if kernels == "packed" and not eligible:
        raise ValueError("kernels=packed needs a bf16 model on a CPU with oneDNN; use kernels=auto or stock")
    return eligible and (kernels == "packed" or (kernels == "auto" and cpu_has_native_bf16() is True))


@torch.no_grad()
def pack_linears(model: nn.Module) -> int:
    """Swap every bf16 ``nn.Linear`` inside ``model`` for a ``PackedLinear``; returns how many."""
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) is nn.Linear and child.weight.dtype == torch.bfloat16]
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child))
    return len(swaps)


def kernels_in_use(model: nn.Module) -> str:
    """``packed`` or ``stock`` linears, ``+short_attn`` with the short-query attention, ``+compile`` when the
    forward is compiled: recorded in rows."""
    from eagle2.core import short_attention

    kind = "packed" if any(isinstance(m, PackedLinear) for m in model.modules()) else "stock"
    base = getattr(model, "base_model", model)
    compiled = getattr(base.forward, "_torchdynamo_orig_callable", None) or getattr(model, "static_decoder", None)
    attention = "+short_attn" if short_attention.in_use(model) else ""
    return kind + attention + ("+compile" if compiled else "")  # static_decoder: eagle2.core.compiled


def wants_short_attention(model: nn.Module, setting: bool = True) -> bool:
    """Whether the model takes ``eagle2.core.short_attention``: asked for, a half-precision transformers model on
    a CPU (elsewhere the function would only hand every call to SDPA)."""
    param = next(model.parameters(), None)
    return (bool(setting) and hasattr(model, "set_attn_implementation") and param is not None
            and param.device.type == "cpu" and param.dtype in (torch.bfloat16, torch.float16))


def accelerate(model: nn.Module, kernels: str = "auto", compile: bool = False,
               short_attention: bool = True) -> nn.Module:
    """``model`` with the fast kernels of this CPU (in place): packed bf16 linears where they pay, the short-query
    attention in half precision (``eagle2.core.short_attention``), and optionally a compiled forward. Inference
    only: a packed linear has no backward."""
    if wants_short_attention(model, short_attention) and not compile:
        from eagle2.core.short_attention import use_short_attention

        use_short_attention(model)
    if compile:  # inductor packs the weights itself (freezing); it cannot lower a PackedLinear
        if next(model.parameters()).device.type == "cpu":
            import torch._inductor.config as inductor_config

            inductor_config.freezing = True
        base = getattr(model, "base_model", model)  # what forward_target calls
        base.forward = torch.compile(base.forward, dynamic=True)
    elif wants_packing(model, kernels):
        log.info("packed %d bf16 linears for oneDNN", pack_linears(model))
    return model
