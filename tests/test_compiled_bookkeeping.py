"""The compiled path's bookkeeping against the eager forward, after padded buckets: the positions a forward
without ``position_ids`` takes (the prefix length on), and the cache length after n tokens run in a larger bucket
(n, not the bucket), at batch 1 (``StaticKV``) and batched (``StaticBatchKV``). The static forward runs uncompiled
(fast); the decoding tests cannot see these (a shift of every position by one leaves RoPE's attention unchanged,
and a cache one entry too long only adds a masked-in padding key the greedy tokens may survive).

Negative controls (by hand): default positions ``slots + 1`` in ``compiled.padded_inputs`` fails
``test_positions_and_length_after_a_padded_bucket``; ``StaticBatchKV.forward`` setting the length to the padded
bucket fails ``test_batched_length_after_a_padded_bucket``.
"""

from __future__ import annotations

import copy

import torch

from eagle2.core.compiled import attach, bucket
from eagle2.core.compiled_batch import StaticBatchKV

TOL = 1e-5  # fp32, the same weights: only summation order differs


def static_twin(target):
    twin = copy.deepcopy(target)
    return twin, attach(twin, compile=False)


def eager_hidden(target, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return target.model(ids).last_hidden_state  # (B, N, H), after the final norm


def test_positions_and_length_after_a_padded_bucket(tiny):
    target = tiny[0]
    _, decoder = static_twin(target)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2]])
    cache = decoder.new_cache()
    assert bucket(3) == 4  # the prompt below runs padded
    (_, positions, _, slots), n = cache.padded_inputs(ids[:, :3])
    assert n == 3 and positions[0, :3].tolist() == [0, 1, 2] and slots[:3].tolist() == [0, 1, 2]
    prompt = cache.forward(ids[:, :3])  # no position_ids: the prefix length on
    assert cache.get_seq_length() == 3
    step = cache.forward(ids[:, 3:5])  # no position_ids again, after the padded bucket
    assert cache.get_seq_length() == 5
    tree = cache.forward(ids[:, 5:7], position_ids=torch.tensor([[5, 6]]))  # as the verifier passes them
    eager = eager_hidden(target, ids)
    assert torch.allclose(torch.cat([prompt, step, tree], dim=1), eager, atol=TOL)


def test_batched_length_after_a_padded_bucket(tiny):
    target = tiny[0]
    _, decoder = static_twin(target)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9], [2, 7, 1, 8, 2, 8]])
    cache = StaticBatchKV(decoder, rows=2)
    prompt = cache.forward(ids[:, :3])  # bucket 4, causal, no position_ids
    assert cache.get_seq_length() == 3 and all(layer.length == 3 for layer in cache.layers)
    step = cache.forward(ids[:, 3:4])
    assert cache.get_seq_length() == 4
    rest = cache.forward(ids[:, 4:6], position_ids=torch.tensor([[4, 5], [4, 5]]))
    eager = eager_hidden(target, ids)
    assert torch.allclose(torch.cat([prompt, step, rest], dim=1), eager, atol=TOL)
