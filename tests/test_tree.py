"""DraftTree structure, masks and positions; the shapes the EAGLE drafters build."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from eagle2.drafters import build_drafter
from eagle2.sampling import SamplingParams
from eagle2.tree import DraftTree
from tests.conftest import tiny_head, tiny_llama


def test_mask_positions_and_paths():
    #        0
    #      1   2
    #     3     4
    tree = DraftTree(torch.tensor([9, 1, 2, 3, 4]), torch.tensor([-1, 0, 0, 1, 2]))
    mask = tree.attention_mask(prefix_len=3, dtype=torch.float32)
    assert mask.shape == (1, 1, 5, 8)
    allowed = (mask[0, 0] == 0).int()
    assert allowed[:, :3].all()  # every node sees the whole prefix
    assert allowed[:, 3:].tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0],
                                       [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]]
    assert mask.min() == torch.finfo(torch.float32).min  # additive float mask, not bool
    assert tree.position_ids(3).tolist() == [[3, 4, 4, 5, 5]]
    assert tree.paths() == [[0, 1, 3], [0, 2, 4]]
    assert tree.children == [[1, 2], [3], [4], [], []]


def test_chain_and_root_only():
    chain = DraftTree.chain(5, [6, 7, 8])
    assert chain.parents.tolist() == [-1, 0, 1, 2]
    assert chain.paths() == [[0, 1, 2, 3]]
    assert DraftTree.root_only(5).attention_mask(4, torch.float32) is None


def test_rejects_unordered_parents():
    import pytest

    with pytest.raises(ValueError):
        DraftTree(torch.tensor([1, 2, 3]), torch.tensor([-1, 2, 0]))


def _drafted_tree(method: dict, seed: int = 0):
    target = tiny_llama(vocab=64, seed=seed)
    head = tiny_head(target, seed=seed + 1)
    drafter = build_drafter(OmegaConf.create(method), target, SamplingParams(), None, head=head)
    with torch.no_grad():
        hidden = target.model(torch.tensor([[3, 4, 5, 6]])).last_hidden_state[0]
        drafter.start([3, 4, 5, 6], 7, hidden)
        return drafter.propose(7, room=100)


def test_static_tree_matches_choices():
    choices = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    tree = _drafted_tree({"name": "eagle", "choices": choices})
    assert len(tree) == len(choices) + 1
    # node for path p: its parent is the node for p[:-1], and its rank among siblings is p[-1]
    paths = sorted(map(tuple, choices), key=lambda p: (len(p), p))
    index = {p: i + 1 for i, p in enumerate(paths)}
    for p, i in index.items():
        assert int(tree.parents[i]) == (index[p[:-1]] if len(p) > 1 else 0)
        assert tree.children[int(tree.parents[i])].index(i) == p[-1]
    # siblings are the parent's most likely children in order: confidences decrease
    for kids in tree.children:
        conf = [float(tree.confidence[k]) for k in kids]
        assert conf == sorted(conf, reverse=True)


def test_eagle2_tree_connected_and_values_monotone():
    for seed in range(3):
        tree = _drafted_tree({"name": "eagle2", "depth": 4, "top_k": 4, "total_tokens": 12}, seed=seed)
        rec = tree.records
        assert len(tree) == 13  # budget + root
        assert len(rec["depth"]) == 4 + 3 * 4 * 4  # every drafted node is recorded
        kept = [i for i, t in enumerate(rec["tree_index"]) if t >= 0]
        assert len(kept) == 12
        # V of each kept node never exceeds its parent's; kept values are the 12 largest drafted ones
        value = torch.tensor(rec["value"])
        for i in range(1, len(tree)):
            parent = int(tree.parents[i])
            if parent:
                assert float(tree.confidence[i]) <= 1.0
        threshold = sorted(rec["value"], reverse=True)[11]
        assert all(value[i] >= threshold - 1e-12 for i in kept)
        # connected: every kept node's parent is the root or a kept node (DraftTree checks order)
        assert all(0 <= int(p) < i for i, p in enumerate(tree.parents.tolist()) if i)


def test_eagle2_value_is_product_of_confidences():
    tree = _drafted_tree({"name": "eagle2", "depth": 3, "top_k": 3, "total_tokens": 8})
    conf = torch.tensor([1.0] + tree.confidence[1:].tolist())
    for path in tree.paths():
        running = 1.0
        for node in path[1:]:
            running *= float(conf[node])
            assert abs(running - float(torch.tensor(tree.records["value"])[
                tree.records["tree_index"].index(node)])) < 1e-5
