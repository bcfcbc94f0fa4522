"""Tensor-to-Python transfers per decoding round, counted on the CPU: each one is a device sync on a GPU.

A ``TorchFunctionMode`` counts every ``.tolist()``, ``.item()``, ``.cpu()``, ``.numpy()`` and
``int()/float()/bool()`` of a tensor during ``generate``. EAGLE-2 reads one small tensor per depth (which
nodes to expand) and the drafted columns once; the static tree reads nothing until its columns; the rest
is the engine's acceptance and the tree contract on host tensors. The bounds below are today's counts, so
a per-node read creeping back (the negative control) fails them.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from eagle2.core.engine import generate
from eagle2.core.sampling import SamplingParams
from eagle2.drafters.eagle2_dynamic import Eagle2Drafter
from eagle2.drafters.eagle_static import EagleStaticDrafter
from tests.conftest import tiny_head, tiny_llama

READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.__int__,
         torch.Tensor.__float__, torch.Tensor.__bool__, torch.Tensor.__index__}


class ReadCounter(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.reads += func in READS
        return func(*args, **(kwargs or {}))


def reads_per_round(drafter_of) -> float:
    target = tiny_llama(vocab=64, layers=2, seed=0, scale=3.0)
    drafter = drafter_of(target, tiny_head(target, seed=1))
    with torch.no_grad(), ReadCounter() as counter:
        out = generate(target, drafter, [3, 4, 5, 6], SamplingParams(), 40, set())
    return counter.reads / len(out.rounds)


def eagle2(target, head):
    return Eagle2Drafter(head, target.lm_head, "cpu", depth=3, top_k=4, total_tokens=10)


def static(target, head):
    return EagleStaticDrafter(head, target.lm_head, "cpu", choices=[[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]])


class PerNodeReads(Eagle2Drafter):
    """Negative control: tree bookkeeping that reads every drafted token back one by one."""

    def propose(self, root, room):
        tree = super().propose(root, room)
        [int(t) for t in tree.tokens]
        return tree


@pytest.mark.parametrize("drafter_of, bound", [(eagle2, 14), (static, 13)], ids=["eagle2", "eagle_static"])
def test_reads_per_round_stay_few(drafter_of, bound):
    assert reads_per_round(drafter_of) <= bound


def test_the_count_catches_per_node_reads():
    chatty = reads_per_round(lambda t, h: PerNodeReads(h, t.lm_head, "cpu", depth=3, top_k=4, total_tokens=10))
    assert chatty > 14 + 5
