"""Several GPUs on a CPU, for the tests of who meets whom: ``VirtualDevices``, a ``TorchFunctionMode``
in which tensors carry a virtual device (``cuda:0``, ``cuda:1``, ...) while computing on the CPU.

Inside the mode a tensor's ``.device`` is its virtual device; factories given ``device=cuda:N``, and
``.to(cuda:N)`` / ``.cuda(N)``, make tensors there; ``.cpu()`` / ``.to("cpu")`` bring them to the host.
Any other operation on tensors of two different devices raises torch's own device-mismatch
``RuntimeError`` (a 0-dim host tensor mixes with anything, as in torch), and its results live where its
inputs do. Host syncs are counted both ways, as a GPU makes them: every read of a virtual-device tensor
into Python (``.item()``, ``.tolist()``, ``int()``, ``float()``, ``bool()``, ``.cpu()``, ``.numpy()``) in
``reads``, every blocking host-to-device copy (``.to(cuda:N)`` / ``.cuda()`` of a host tensor without
``non_blocking=True``, ``torch.tensor(data, device=cuda:N)``: on CUDA a copy from pageable memory waits
for the stream) in ``writes``; ``syncs`` is their sum. A parameter made inside the mode from a tagged
tensor (``torch.nn.Linear(..., device=cuda:1)``) carries its data's device.

What this does not model: asynchrony, memory, peer-to-peer speed, and operations outside torch's
function API (a module that reaches device memory by other means). ``place(module, device)`` tags a
module's parameters and buffers (``Module.to`` would swap them for new tensors).
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakTensorKeyDictionary

HOST = torch.device("cpu")
READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.numpy, torch.Tensor.__int__, torch.Tensor.__float__,
         torch.Tensor.__bool__, torch.Tensor.__index__}
MOVES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu}
FROM_DATA = {torch.tensor, torch.as_tensor}  # factories that copy host data to their device


class VirtualDevices(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.where = WeakTensorKeyDictionary()  # tensor -> its virtual device (absent: the host)
        self.reads = 0  # device-to-host reads
        self.writes = 0  # blocking host-to-device copies

    @property
    def syncs(self) -> int:
        """Host syncs both ways: reads and blocking host-to-device copies."""
        return self.reads + self.writes

    def __enter__(self):
        self._parameter_new = torch.nn.Parameter.__new__
        where, original = self.where, self._parameter_new

        def tagged_parameter(cls, data=None, requires_grad=True):  # a Parameter is a new tensor: keep the tag
            param = original(cls, data, requires_grad)
            if data is not None and data in where:
                where[param] = where[data]
            return param

        torch.nn.Parameter.__new__ = tagged_parameter
        return super().__enter__()

    def __exit__(self, *exc):
        torch.nn.Parameter.__new__ = self._parameter_new
        return super().__exit__(*exc)

    # -- placing -----------------------------------------------------------------------------
    def place(self, obj, device):
        """Put a tensor, or a module's parameters and buffers, on the virtual ``device``; returns ``obj``."""
        device = torch.device(device)
        tensors = [obj] if torch.is_tensor(obj) else [*obj.parameters(), *obj.buffers()]
        for t in tensors:
            if device.type == "cpu":
                self.where.pop(t, None)
            else:
                self.where[t] = device
        return obj

    def device_of(self, t: torch.Tensor) -> torch.device:
        return self.where.get(t, HOST)

    # -- the mode ----------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if getattr(func, "__self__", None) is torch.Tensor.device:  # the .device getter
            return self.device_of(args[0])
        if func in READS:
            self.reads += self.device_of(args[0]).type != "cpu"
            return func(*args, **kwargs)
        if func in MOVES:
            return self._move(func, args, kwargs)
        wanted = kwargs.get("device")
        if wanted is not None and torch.device(wanted).type != "cpu":  # a factory on a virtual device
            kwargs["device"] = "cpu"
            self._check(args, kwargs)
            self.writes += func in FROM_DATA
            return self._tag(func(*args, **kwargs), torch.device(wanted))
        device = self._check(args, kwargs)
        out = func(*args, **kwargs)
        return out if device.type == "cpu" else self._tag(out, device)

    def _move(self, func, args, kwargs):
        source = args[0]
        here = self.device_of(source)
        non_blocking = bool(kwargs.get("non_blocking", False))
        if func is torch.Tensor.cpu:
            target = HOST
        elif func is torch.Tensor.cuda:
            index = args[1] if len(args) > 1 else kwargs.pop("device", 0)
            target, args, kwargs = torch.device("cuda", int(index)) if not isinstance(index, torch.device) \
                else index, args[:1], {}
        else:
            target, args, kwargs = self._to_target(here, args, kwargs)
        self.reads += here.type != "cpu" and target.type == "cpu"
        self.writes += here.type == "cpu" and target.type != "cpu" and not non_blocking
        out = torch.Tensor.to(*args, **kwargs)
        if out is source and target != here:  # another device: a copy (the source keeps its tag)
            out = source.clone()
        return out if target.type == "cpu" else self._tag(out, target)

    def _to_target(self, here, args, kwargs):
        """(where ``.to(...)`` goes, the args and kwargs with the device made the host)."""
        rest, target = [], here
        for a in args[1:]:
            if isinstance(a, (torch.device, str)):
                target = torch.device(a)
            elif torch.is_tensor(a):
                target = self.device_of(a)
                rest.append(a.dtype)
            else:
                rest.append(a)
        if "device" in kwargs:
            target = torch.device(kwargs.pop("device"))
        if target.type == "cuda" and target.index is None:
            target = torch.device("cuda", 0)
        return target, (args[0], *rest), kwargs

    def _check(self, args, kwargs) -> torch.device:
        """The one device of the tensors in ``args``/``kwargs``; raises torch's mismatch error on two."""
        found: list[torch.device] = []
        for t in _tensors((args, kwargs)):
            device = self.device_of(t)
            if device.type == "cpu" and t.dim() == 0:  # a host scalar goes with anything
                continue
            if device not in found:
                found.append(device)
        if len(found) > 1:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{found[0]} and {found[1]}!")
        return found[0] if found else HOST

    def _tag(self, out, device):
        for t in _tensors(out):
            self.where[t] = device
        return out


def _tensors(obj):
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)
