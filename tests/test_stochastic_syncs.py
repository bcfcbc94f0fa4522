"""Host syncs of stochastic acceptance (temperature > 0), counted on a CPU, and the batched draws of a
generator on a GPU certified against the target's distribution.

The target's distributions sit on a virtual GPU (``tests.virtual_devices``: every read of a device
tensor into Python counts as a sync); acceptance must bring them to the host once per accepted depth
(``accept.node_rows``), not once per sibling tried. ``TorchDraws(batch=...)``, what a GPU generator
gets, must read its uniforms once per batch and keep every distribution exact.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from eagle2.core.accept import accept_stochastic
from eagle2.core.sampling import TorchDraws, inverse_cdf
from eagle2.core.tree import DraftTree
from tests.test_certification import PASS_P, chi_square_p
from tests.virtual_devices import VirtualDevices

VOCAB = 8
LAST, FIRST = torch.device("cuda", 1), torch.device("cuda", 0)


def wide_tree(gen, sampled: bool) -> tuple[DraftTree, torch.Tensor]:
    """Root with 4 children, each with 3, the first of those with 2: (tree, p_target (N, V))."""
    parents = [-1, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 5, 5]
    tokens = torch.randint(VOCAB, (len(parents),), generator=gen)
    p = torch.softmax(torch.randn(len(parents), VOCAB, generator=gen), -1)
    q = torch.softmax(torch.randn(len(parents), VOCAB, generator=gen), -1) if sampled else None
    return DraftTree(tokens, torch.tensor(parents), q_draft=q), p


@pytest.mark.parametrize("sampled", [False, True], ids=["deterministic", "sampled"])
def test_acceptance_reads_the_device_once_per_depth(sampled):
    gen = torch.Generator().manual_seed(0)
    tried_several = 0
    for seed in range(200):
        tree, p = wide_tree(torch.Generator().manual_seed(seed), sampled)
        with VirtualDevices() as vd:
            vd.place(p, LAST)  # the target's LM head's GPU
            if tree.q_draft is not None:
                vd.place(tree.q_draft, FIRST)  # the drafter's
            path, bonus = accept_stochastic(tree, p, gen)
        assert vd.syncs <= len(path) + 1, (seed, path, vd.syncs)
        tried_several += len(path) < 2  # a rejected sibling at some depth: the per-sibling reads would show
    assert tried_several > 50  # the bound was tested where siblings were rejected


def test_the_split_target_decodes_at_temperature_1_as_on_the_host(monkeypatch):
    """End to end at T=1: EAGLE-2 on a target over two virtual GPUs, seeded, equals the host run, and a
    round reads the device a bounded number of times (drafting: one per depth and one for the tree;
    acceptance: one per accepted depth and one)."""
    from eagle2.core.engine import generate
    from eagle2.core.sampling import SamplingParams
    from eagle2.drafters.eagle2_dynamic import Eagle2Drafter
    from tests.conftest import tiny_head, tiny_llama
    from tests.test_multi_device import FIRST as HEAD
    from tests.test_multi_device import PROMPT, split

    monkeypatch.setattr("eagle2.core.clock.uses_events", lambda device: False)
    target = tiny_llama(vocab=64, layers=2, seed=0, scale=3.0)
    head = tiny_head(target, seed=1)
    params, depth = SamplingParams(temperature=1.0), 3

    def run():  # a GPU generator's draws (batched uniforms, tokens by inverse CDF) on both sides
        drafter = Eagle2Drafter(head, target.lm_head, target.device, depth=depth, top_k=3, total_tokens=8)
        draws = TorchDraws(torch.Generator().manual_seed(3), batch=64)
        return generate(target, drafter, PROMPT, params, 24, set(), generator=draws)

    with torch.no_grad():
        host = run()
        with VirtualDevices() as vd:
            split(vd, target)
            vd.place(head, HEAD)
            head.attach_embedding(target.get_input_embeddings())
            spread = run()
    assert spread.output_ids == host.output_ids
    rounds = len(spread.rounds)
    accepted_depths = sum(r.accepted for r in spread.rounds)
    # per round: drafting depth + 1, acceptance accepted + 1, the engine's tokens read and its first token
    bound = rounds * (depth + 1 + 1 + 2) + accepted_depths + 2
    assert vd.syncs <= bound, (vd.syncs, bound, rounds)


class RandCalls(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += func is torch.rand
        return func(*args, **(kwargs or {}))


def test_batched_draws_read_once_per_batch():
    gen = torch.Generator().manual_seed(0)
    draws = TorchDraws(gen, batch=16)
    with RandCalls() as counter:
        coins = [draws.accept(0.5) for _ in range(40)]
    assert counter.calls == 3  # 40 coins from 3 batches of 16, not 40 draws
    assert 5 < sum(coins) < 35
    assert TorchDraws(gen).batch == 1 and TorchDraws(None).batch == 1  # the host keeps its one-by-one calls


def test_inverse_cdf_never_picks_a_token_without_mass():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0])
    assert [inverse_cdf(probs, u) for u in (0.0, 0.49, 0.5, 0.999999, 1.0)] == [1, 1, 3, 3, 3]


@pytest.mark.parametrize("sampled", [False, True], ids=["deterministic", "sampled"])
def test_batched_draws_keep_the_first_token_distribution(sampled):
    """The rule-level certification with a GPU generator's draws: the first emitted token ~ p_target[0]."""
    tree, p = wide_tree(torch.Generator().manual_seed(11), sampled)
    draws, n = TorchDraws(torch.Generator().manual_seed(1), batch=64), 20000
    roots = tree.children[0]
    if sampled:  # each sample its own candidates, each root child drawn from its q row
        fresh = torch.multinomial(tree.q_draft[roots], n, replacement=True, generator=torch.Generator().manual_seed(2))
    counts = torch.zeros(VOCAB)
    for i in range(n):
        if sampled:
            tree.tokens[roots] = fresh[:, i]
        path, bonus = accept_stochastic(tree, p, draws)
        counts[int(tree.tokens[path[0]]) if path else bonus] += 1
    assert chi_square_p(counts, p[0]) > PASS_P
