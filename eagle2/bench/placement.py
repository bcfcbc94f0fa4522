"""Where a target's weights go when ``model.device_map`` spreads them (``auto``): placement you can trust.

accelerate, left to itself, caps each GPU at about 90% of its free memory and sends what does not fit
to host memory or disk, where it is streamed over PCIe on every forward: a 70B target in fp16 (128-131
GiB) on one 141 GB GPU would run, slowly, without a word. Here instead:

- every GPU gets an explicit budget (``max_memory``): ``model.max_memory`` when set (``{0: 70GiB, 1:
  70GiB}``), else its free memory less ``model.gpu_reserve_gib`` (default 6 GiB: KV cache, the draft
  head, activations);
- a target whose weights exceed the GPUs' budgets together, less its largest layer per GPU (the room
  accelerate keeps on the first GPU, and what a GPU may leave unfilled), is refused before loading, in one
  line (``PlacementError``), unless ``model.allow_offload=true``;
- after loading, any module placed off the run's device type (``cpu`` or ``disk`` for a GPU run) is
  refused the same way unless ``model.allow_offload=true``;
- every result row records the placement (``placement``: ``summary``), e.g. ``cuda:0 x43, cuda:1 x42``.
"""

from __future__ import annotations

from collections import Counter

import torch

GIB = 2**30
DEFAULT_RESERVE_GIB = 6.0
OFFLOAD_HINT = "model.allow_offload=true (slow: offloaded layers stream over PCIe on every forward)"


class PlacementError(RuntimeError):
    """A target that does not fit its GPUs, or was placed off them, without ``model.allow_offload``."""


def to_bytes(size) -> int:
    """``70GiB``, ``500MB``, ``1e9`` or an int -> bytes."""
    if isinstance(size, (int, float)):
        return int(size)
    text = str(size).strip().upper().replace(" ", "")
    for unit, factor in (("GIB", GIB), ("MIB", 2**20), ("KIB", 2**10), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3),
                         ("B", 1)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(float(text))


def _skeleton(config):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def weights_bytes(config, dtype: torch.dtype) -> int:
    """Bytes of the target's parameters in ``dtype``, counted on the meta device (no memory, seconds)."""
    return sum(p.numel() for p in _skeleton(config).parameters()) * torch.empty((), dtype=dtype).element_size()


def largest_layer_bytes(config, dtype: torch.dtype) -> int:
    """Bytes of the target's largest layer in ``dtype`` as accelerate counts it (a module with no children or
    of a no-split class: the LM head, 1.96 GiB, at LLaMA-3-70B's 128k vocabulary): the room accelerate's
    ``infer_auto_device_map`` keeps free on the first GPU, and the most a GPU can leave unfilled when the
    next layer does not fit it."""
    from accelerate.utils import compute_module_sizes, get_max_layer_size

    model = _skeleton(config)
    sizes = compute_module_sizes(model, dtype=dtype)
    size, _ = get_max_layer_size(list(model.named_children()), sizes, list(model._no_split_modules or []))
    return int(size)


def gpu_budgets(model_cfg) -> dict[int, int]:
    """Bytes each visible GPU may take: ``model.max_memory`` as given, else free memory less the reserve."""
    given = model_cfg.get("max_memory")
    if given:
        return {int(k): to_bytes(v) for k, v in dict(given).items() if str(k).isdigit()}
    reserve = float(model_cfg.get("gpu_reserve_gib") or DEFAULT_RESERVE_GIB) * GIB
    return {i: max(0, int(torch.cuda.mem_get_info(i)[0] - reserve)) for i in range(torch.cuda.device_count())}


def max_memory(name: str, needed: int, budgets: dict[int, int], allow_offload: bool, largest: int = 0) -> dict:
    """accelerate's ``max_memory`` for a target of ``needed`` bytes over GPUs with ``budgets``; raises
    ``PlacementError`` (one line) when it does not fit and offloading is not allowed. ``largest``: the
    target's largest layer (``largest_layer_bytes``), which accelerate keeps free on the first GPU and
    which each further GPU may leave unfilled: counted against the budgets, so a target refused by
    accelerate (transformers' ``offload_folder`` error) is refused here first."""
    total = sum(budgets.values())
    usable = total - largest * max(1, len(budgets))
    if needed > usable and not allow_offload:
        per_gpu = ", ".join(f"cuda:{i} {b / GIB:.1f}" for i, b in sorted(budgets.items())) or "no GPU"
        held = f", less {largest / GIB:.2f} GiB per GPU for its largest layer (accelerate's reserve)" if largest else ""
        raise PlacementError(f"{name}: {needed / GIB:.1f} GiB of weights do not fit the GPUs' {total / GIB:.1f} GiB "
                             f"({per_gpu} GiB after the reserve{held}); use more GPUs, model.max_memory, a smaller "
                             f"model.gpu_reserve_gib, or {OFFLOAD_HINT}")
    plan: dict = dict(budgets)
    if allow_offload:
        plan["cpu"] = "1024GiB"  # what does not fit goes to host memory, as asked
    return plan


def offloaded(device_map: dict | None, device) -> list[str]:
    """Modules of an ``hf_device_map`` placed off the run's device type (disk always counts)."""
    kind = torch.device(device).type
    placed = (device_map or {}).items()
    return [name for name, where in placed if str(where) == "disk" or device_kind(where) != kind]


def device_kind(where) -> str:
    if isinstance(where, int):
        return "cuda"
    text = str(where)
    return "disk" if text == "disk" else torch.device(text).type


def check_offload(name: str, device_map: dict | None, device, allow_offload: bool) -> None:
    off = offloaded(device_map, device)
    if off and not allow_offload:
        shown = ", ".join(f"{m} -> {device_map[m]}" for m in off[:3])
        shown += f" (+{len(off) - 3} more)" if len(off) > 3 else ""
        raise PlacementError(f"{name}: {len(off)} module(s) were placed off the GPUs ({shown}); "
                             f"set model.max_memory, use more GPUs, or {OFFLOAD_HINT}")


def summary(model) -> str:
    """The target's placement in one field: ``cuda:0 x43, cuda:1 x42`` (modules per device, from
    ``hf_device_map``), or its one device (``cpu``, ``cuda:0``) when it was not spread."""
    device_map = getattr(model, "hf_device_map", None)
    if not device_map:
        return str(model.device)
    counts = Counter(f"cuda:{w}" if isinstance(w, int) else str(w) for w in device_map.values())
    if len(device_map) == 1:
        return next(iter(counts))
    return ", ".join(f"{where} x{n}" for where, n in sorted(counts.items()))
