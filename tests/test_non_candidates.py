"""Non-candidate tree nodes (``DraftTree.candidate``): verified in the same target forward, never accepted,
their target outputs handed back to the drafter (``observe_target``).

The drafter here proposes one wrong candidate and, as non-candidates, a chain holding the target's own
greedy continuation: if acceptance could see those nodes it would accept them (at temperature 0 always,
at temperature 1 often). The check counts accepted non-candidate nodes over whole decodings (batch 1 and
batched); the negative control gives acceptance a tree whose ``children`` list every node (a mechanism
that lets non-candidates through) and the same check must catch it.
"""

from __future__ import annotations

from collections import deque

import pytest
import torch

import eagle2.core.engine as engine
from eagle2.core.batch_engine import BatchEngine, BatchRequest
from eagle2.core.sampling import SamplingParams
from eagle2.core.tree import DraftTree
from tests.test_greedy import PROMPTS, decode

GREEDY, T1 = SamplingParams(0.0), SamplingParams(1.0)
N_TOKENS = 24


class WindowRider:
    """Root + one wrong candidate; the true next tokens (from ``reference``) ride as non-candidates."""

    needs_hidden = False
    forward_time = 0.0

    def __init__(self, reference: list[int], vocab: int):
        self.reference, self.vocab, self.seen = reference, vocab, []

    def start(self, prompt_ids, first_token, prompt_hidden) -> None:
        self.out = [first_token]

    def propose(self, root: int, room: int) -> DraftTree:
        ahead = self.reference[len(self.out): len(self.out) + 3]
        if self.out != self.reference[: len(self.out)] or not ahead or room < 2 + len(ahead):
            return DraftTree.root_only(root)
        tokens = [root, (ahead[0] + 1) % self.vocab, *ahead]
        parents = [-1, 0, 0, *range(2, 1 + len(ahead))]
        candidate = torch.tensor([True, True] + [False] * len(ahead))
        return DraftTree(torch.tensor(tokens), torch.tensor(parents), candidate=candidate)

    def observe_target(self, tree: DraftTree, target_logits: torch.Tensor) -> None:
        self.seen.append((tree, target_logits))

    def observe(self, new_tokens, hidden) -> None:
        self.out.extend(new_tokens)


def count_accepted_non_candidates(monkeypatch, target, params: SamplingParams, batched: bool):
    """(non-candidate nodes accepted, outputs, drafters) over PROMPTS, at batch 1 or all in one batch."""
    accepted_non_candidates = []
    for name in ("accept_greedy", "accept_stochastic"):
        real = getattr(engine, name)

        def watched(tree, *args, _real=real):
            path, bonus = _real(tree, *args)
            accepted_non_candidates.extend(i for i in path if i in set(tree.non_candidates()))
            return path, bonus

        monkeypatch.setattr(engine, name, watched)
    vocab = target.config.vocab_size
    drafters = [WindowRider(decode(target, {"name": "plain"}, p, N_TOKENS).output_ids, vocab) for p in PROMPTS]
    gens = [torch.Generator().manual_seed(i) for i in range(len(PROMPTS))]
    if batched:
        queue = deque(BatchRequest(p, d, N_TOKENS, g, key=i)
                      for i, (p, d, g) in enumerate(zip(PROMPTS, drafters, gens)))
        finished = {}
        BatchEngine(target, params, set(), len(PROMPTS)).run(queue, lambda r: finished.update({r.request.key: r}))
        outputs = [finished[i].output.output_ids for i in range(len(PROMPTS))]
    else:
        outputs = [engine.generate(target, d, p, params, N_TOKENS, set(), g).output_ids
                   for p, d, g in zip(PROMPTS, drafters, gens)]
    return len(accepted_non_candidates), outputs, drafters


def test_children_list_candidates_only():
    tree = DraftTree(torch.tensor([5, 6, 7, 8, 9]), torch.tensor([-1, 0, 0, 2, 1]),
                     candidate=torch.tensor([True, True, False, False, True]))
    assert tree.children == [[1], [4], [], [], []]
    assert tree.non_candidates() == [2, 3]
    assert tree.paths() == [[0, 1, 4]]
    assert tree.ancestor_matrix()[3].tolist() == [True, False, True, True, False]  # the mask sees every node
    with pytest.raises(ValueError, match="candidate under a non-candidate"):
        DraftTree(torch.tensor([5, 6, 7]), torch.tensor([-1, 0, 1]), candidate=torch.tensor([True, False, True]))
    with pytest.raises(ValueError, match="root's True"):
        DraftTree(torch.tensor([5, 6]), torch.tensor([-1, 0]), candidate=torch.tensor([False, True]))


@pytest.mark.parametrize("batched", [False, True], ids=["batch1", "batched"])
@pytest.mark.parametrize("params", [GREEDY, T1], ids=["T0", "T1"])
def test_non_candidates_ride_but_are_never_accepted(tiny, monkeypatch, params, batched):
    target = tiny[0]
    accepted, outputs, drafters = count_accepted_non_candidates(monkeypatch, target, params, batched)
    assert accepted == 0
    if params.greedy:
        assert outputs == [d.reference for d in drafters]  # token-identical to plain decoding
    windows = 0
    for drafter in drafters:  # the target's outputs at every node came back, the window's included
        for tree, logits in drafter.seen:
            assert logits.shape == (len(tree), target.config.vocab_size)
            window = tree.non_candidates()
            if window and params.greedy:  # the window holds the greedy continuation: each node predicts the next
                windows += 1
                predicted = logits[window[:-1]].argmax(-1).tolist()
                assert predicted == tree.tokens[window[1:]].tolist()
    assert windows > 5 or not params.greedy


def test_broken_mechanism_is_caught(tiny, monkeypatch):
    """Negative control: acceptance handed every node as a child (non-candidates visible) accepts them."""
    real = DraftTree.__post_init__

    def every_node_a_child(self):
        real(self)
        self.children = [[] for _ in self._parents]
        for i, p in enumerate(self._parents[1:], start=1):
            self.children[p].append(i)

    monkeypatch.setattr(DraftTree, "__post_init__", every_node_a_child)
    accepted, _, _ = count_accepted_non_candidates(monkeypatch, tiny[0], GREEDY, batched=False)
    assert accepted > 10
