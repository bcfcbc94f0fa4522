"""Host syncs of one EAGLE-2 round, counted both ways on a CPU (``tests.virtual_devices``: device-to-host
reads and blocking host-to-device copies), on a target split over two virtual GPUs.

Drafting costs one read (the drafted columns, in one transfer) and one copy (the committed tokens the head
catches up on) per round at any depth: the nodes to expand at each depth are picked on the device and the
head's ancestor mask is built there. Verification copies the tree once (tokens, positions and ancestors
packed together). Acceptance reads once at T=0, once per accepted depth and once more at T=1; the cache
commit copies its index to each GPU when a round keeps a path that is not the tree's first nodes.
"""

from __future__ import annotations

import pytest
import torch

from eagle2.core.engine import generate
from eagle2.core.sampling import SamplingParams
from eagle2.drafters.eagle2_dynamic import Eagle2Drafter
from tests.conftest import tiny_head, tiny_llama
from tests.test_multi_device import FIRST, PROMPT, split
from tests.virtual_devices import VirtualDevices

DEPTH = 6  # the syncs of a depth would show six times


class Counted(Eagle2Drafter):
    """EAGLE-2 whose ``propose`` records the harness's (reads, writes) it made."""

    def propose(self, root, room):
        before = (self.vd.reads, self.vd.writes)
        tree = super().propose(root, room)
        self.per_propose.append((self.vd.reads - before[0], self.vd.writes - before[1]))
        return tree


def split_round_syncs(temperature: float, drafter_class=Counted):
    """(the output, the harness, the drafter) of 40 new tokens on the split target (host clock)."""
    target = tiny_llama(vocab=64, layers=2, seed=0, scale=3.0)
    head = tiny_head(target, seed=1)
    with torch.no_grad(), VirtualDevices() as vd:
        split(vd, target)
        vd.place(head, FIRST)
        head.attach_embedding(target.get_input_embeddings())
        drafter = drafter_class(head, target.lm_head, target.device, depth=DEPTH, top_k=3, total_tokens=12)
        drafter.vd, drafter.per_propose = vd, []
        out = generate(target, drafter, PROMPT, SamplingParams(temperature=temperature), 40, set(),
                       generator=torch.Generator().manual_seed(0))
    return out, vd, drafter


@pytest.fixture(autouse=True)
def host_clock(monkeypatch):
    monkeypatch.setattr("eagle2.core.clock.uses_events", lambda device: False)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["T=0", "T=1"])
def test_a_drafting_round_syncs_once_each_way_at_any_depth(temperature):
    _, _, drafter = split_round_syncs(temperature)
    assert drafter.per_propose and set(drafter.per_propose) == {(1, 1)}, drafter.per_propose


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["T=0", "T=1"])
def test_a_whole_round_syncs_a_bounded_number_of_times(temperature):
    """Per round: drafting 1 read + 1 copy, verification 1 copy, acceptance 1 read (T=1: plus one per
    accepted depth), the commit one copy per GPU; plus the prefill's prompt and first token."""
    out, vd, _ = split_round_syncs(temperature)
    rounds, accepted = len(out.rounds), sum(r.accepted for r in out.rounds)
    stochastic = accepted if temperature > 0 else 0
    assert vd.reads <= 2 * rounds + stochastic + 2, (vd.reads, rounds, accepted)
    assert vd.writes <= 4 * rounds + 2, (vd.writes, rounds)
    print(f"T={temperature}: {rounds} rounds, {vd.reads / rounds:.2f} reads, {vd.writes / rounds:.2f} copies a round")


class ReadsEachDepth(Counted):
    """Negative control: the expanded nodes read to the host at each depth (as before they were picked on
    the device)."""

    def expand(self, tokens, parent_fed, depth, parent_features):
        parent_fed.tolist()
        return super().expand(tokens, parent_fed, depth, parent_features)


def test_a_read_per_depth_is_caught():
    _, _, drafter = split_round_syncs(0.0, ReadsEachDepth)
    assert set(drafter.per_propose) == {(DEPTH, 1)}


def head_masks(drafter_class=Eagle2Drafter):
    """(mask, expected) per depth of one drafting round: the head's additive mask over the tree part as
    built on the device, and the ancestor matrix walked on the host from the fed parents (the old way)."""
    target = tiny_llama(vocab=64, layers=2, seed=0, scale=3.0)
    drafter = drafter_class(tiny_head(target, seed=1), target.lm_head, "cpu", depth=DEPTH, top_k=3, total_tokens=12)
    seen, fed_parent = [], []
    real_head = drafter._head

    def record(tokens, feats, positions, mask):
        if expanding:  # not the catch-up's causal mask
            seen.append(mask[0, 0, :, drafter.committed:] == 0)  # allowed tree entries of the newest nodes
        return real_head(tokens, feats, positions, mask)

    def expand(tokens, parent_fed, depth, parent_features):
        if drafter.fed == 0:  # a new round: the head's tree entries were dropped at the catch-up
            fed_parent.clear()
        parents = parent_fed.tolist()
        expected = torch.zeros(len(parents), len(fed_parent) + len(parents), dtype=torch.bool)
        for row, p in enumerate(parents):
            expected[row, len(fed_parent) + row] = True
            while p != -1:
                expected[row, p], p = True, fed_parent[p]
        fed_parent.extend(parents)
        wanted.append(expected)
        expanding.append(True)
        try:
            return type(drafter).expand(drafter, tokens, parent_fed, depth, parent_features)
        finally:
            expanding.clear()

    wanted, expanding = [], []
    drafter._head, drafter.expand = record, expand
    with torch.no_grad():
        generate(target, drafter, PROMPT, SamplingParams(), 6, set())
    return seen, wanted


def test_the_heads_tree_mask_is_built_on_the_device_as_on_the_host():
    seen, wanted = head_masks()
    assert len(seen) == len(wanted) >= 2 * (DEPTH - 1)  # at least two rounds
    assert all(torch.equal(s, w) for s, w in zip(seen, wanted))


class ForgetsAncestors(Eagle2Drafter):
    """Negative control: each depth's nodes see only themselves and their parent's own row."""

    def expand(self, tokens, parent_fed, depth, parent_features):
        self.fed_ancestors = torch.eye(self.fed, dtype=torch.bool)
        return super().expand(tokens, parent_fed, depth, parent_features)


def test_a_mask_that_forgets_ancestors_is_caught():
    seen, wanted = head_masks(ForgetsAncestors)
    assert not all(torch.equal(s, w) for s, w in zip(seen, wanted))
