"""Data-parallel training across processes started by ``torchrun`` (gloo on CPUs, nccl on CUDA).

What it knows: the process group (joined from torchrun's environment: ``WORLD_SIZE``, ``RANK``,
``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``), this process's rank and the world size, a barrier, and
the two collectives a training step needs:

- ``all_reduce_gradients``: every rank's gradients replaced by their mean over the ranks **weighted by
  each rank's count of loss positions** (``sum_r n_r g_r / sum_r n_r``), in one all-reduce of one flat
  buffer that also carries the counts and the step's real tokens. Each rank's loss is a mean over its own
  ``n_r`` positions, so this is exactly the gradient of the loss over the union of the ranks' batches (a
  plain mean over ranks, as ``DistributedDataParallel`` takes, is that only when every ``n_r`` is equal).
  The module is never wrapped: the loss functions call a head's submodules directly, which a wrapper's
  forward hooks would not see.
- ``merge_stats``: the loss stats of one step, position-weighted over the ranks (``n`` summed).

What it does not know: which batches a rank trains on (``loop.step_groups``) or what a checkpoint holds.
Without torchrun (``WORLD_SIZE`` unset or 1) every function is the one-process identity.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def launched() -> bool:
    """Whether torchrun (or another launcher setting ``WORLD_SIZE``) started more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init() -> str | None:
    """Join the process group torchrun describes, once: nccl with this process's GPU (``LOCAL_RANK``)
    when CUDA is there, else gloo. Returns the device this rank should train on (``cuda:LOCAL_RANK``),
    or None on CPUs and in a single process."""
    if not launched():
        return None
    cuda = torch.cuda.is_available()
    device = None
    if cuda:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return device


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def is_main() -> bool:
    """Rank 0: the one process that writes checkpoints, metrics and exports."""
    return rank() == 0


def barrier() -> None:
    if active():
        dist.barrier()


def close() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_gradients(params: list[torch.nn.Parameter], positions: int, tokens: int) -> tuple[int, int]:
    """Make every rank's gradients the position-weighted mean over the ranks (see the module docstring);
    returns (positions, tokens) summed over the ranks. A rank without a batch this step passes
    ``positions = 0`` (its gradients, None or not, count for nothing). One process: unchanged."""
    if not active():
        return positions, tokens
    device = params[0].device
    parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() * positions
             for p in params]
    flat = torch.cat(parts + [torch.tensor([positions, tokens], dtype=torch.float32, device=device)])
    dist.all_reduce(flat)
    total_positions, total_tokens = int(round(flat[-2].item())), int(round(flat[-1].item()))
    flat = flat[:-2] / max(total_positions, 1)
    offset = 0
    for p in params:
        p.grad = flat[offset: offset + p.numel()].view_as(p).to(p.dtype)
        offset += p.numel()
    return total_positions, total_tokens


def all_gather_objects(obj) -> list:
    """``obj`` of every rank, in rank order (one process: ``[obj]``)."""
    if not active():
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def merge_stats(stats: dict) -> dict:
    """One step's loss stats over the ranks: each number position-weighted by its rank's ``n`` (a rank
    without positions counts for nothing), ``n`` and ``n_*`` summed. One process: unchanged."""
    if not active():
        return stats
    every = all_gather_objects(stats)
    merged: dict = {}
    for key in {k for s in every for k in s}:
        have = [s for s in every if key in s and isinstance(s[key], (int, float))]
        name = key.rsplit("/", 1)[-1]  # (a joint run's per-head counts: ``eagle3/n_s2``)
        if name == "n" or name.startswith("n_"):
            merged[key] = sum(s[key] for s in have)
            continue
        weight = sum(s.get("n", 0) for s in have)
        merged[key] = (sum(s[key] * s.get("n", 0) for s in have) / weight if weight
                       else sum(s[key] for s in have) / max(len(have), 1))
    return merged
