"""DraftTree structure, masks and positions; the shapes the EAGLE drafters build."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from omegaconf import OmegaConf

from eagle2.bench.methods import build_drafter
from eagle2.core.sampling import SamplingParams
from eagle2.core.tree import DraftTree
from eagle2.drafters.eagle_common import tree_from_drafted
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


def assert_eagle2_tree_sound(tree, budget: int) -> None:
    """Structure an EAGLE-2 draft must have, checked against the records of every drafted node:
    each kept node's parent is the root or a kept node (the drafted parent, at one depth less), a
    child's path value V never exceeds its parent's, and the kept nodes are the ``budget`` best by V."""
    rec = tree.records
    kept = [i for i, t in enumerate(rec["tree_index"]) if t >= 0]
    assert len(kept) == budget == len(tree) - 1
    drafted = {rec["tree_index"][i]: i for i in kept}  # tree node -> drafted node
    assert sorted(drafted) == list(range(1, len(tree))), "tree nodes and kept drafted nodes differ"
    value = [1.0] + [rec["value"][drafted[t]] for t in range(1, len(tree))]  # V(root) = 1
    depths = tree.depths.tolist()
    for t in range(1, len(tree)):
        parent, node = int(tree.parents[t]), drafted[t]
        assert rec["parent_tree_index"][node] >= 0, f"node {t}: its drafted parent is not kept"
        assert rec["parent_tree_index"][node] == parent, f"node {t}: hung under {parent}, not its drafted parent"
        assert depths[t] == rec["depth"][node], f"node {t}: tree depth {depths[t]} != drafted {rec['depth'][node]}"
        assert 0 < float(tree.confidence[t]) <= 1.0
        assert value[t] <= value[parent] * (1 + 1e-6), f"node {t}: V {value[t]:.4g} > parent's {value[parent]:.4g}"
    threshold = sorted(rec["value"], reverse=True)[budget - 1]
    assert all(rec["value"][i] >= threshold * (1 - 1e-6) for i in kept)


def test_eagle2_tree_connected_and_values_monotone():
    for seed in range(3):
        tree = _drafted_tree({"name": "eagle2", "depth": 4, "top_k": 4, "total_tokens": 12}, seed=seed)
        assert len(tree) == 13  # budget + root
        assert len(tree.records["depth"]) == 4 + 3 * 4 * 4  # every drafted node is recorded
        assert_eagle2_tree_sound(tree, 12)


def _broken_tree_from_drafted(root, tokens, parents, depth, rank, log_conf, log_value, keep, *, bug, **meta):
    """tree_from_drafted with a deliberate bug: ``values`` computes path values with a sign error
    (log V = log c - log V(parent), so a child beats its parent); ``orphan`` drops the parent of the
    deepest kept node (keeping the best unkept node instead) and hangs nodes whose parent is not
    kept on the root."""
    if bug == "values":
        value = log_conf.clone()
        for i, p in enumerate(parents.tolist()):
            if p >= 0:
                value[i] -= value[p]
        return tree_from_drafted(root, tokens, parents, depth, rank, log_conf, value, keep, **meta)
    deepest = int(keep[torch.argmax(depth[keep])])
    assert int(depth[deepest]) >= 2
    dropped = parents[deepest]
    unkept = torch.ones(len(tokens), dtype=torch.bool)
    unkept[keep] = False
    unkept[dropped] = False
    best_unkept = torch.where(unkept, log_value, float("-inf")).argmax()  # the budget stays full
    keep = torch.cat([keep[keep != dropped], best_unkept[None]]).sort().values
    tree_index = torch.full((len(tokens),), -1, dtype=torch.long)
    tree_index[keep] = torch.arange(1, len(keep) + 1)
    parent_tree_index = [0 if p < 0 else int(tree_index[p]) for p in parents.tolist()]
    tree = DraftTree(torch.cat([torch.tensor([root]), tokens[keep]]),
                     torch.tensor([-1, *(max(parent_tree_index[i], 0) for i in keep.tolist())]),
                     confidence=torch.cat([torch.ones(1), log_conf[keep].exp()]))
    tree.records = {"depth": depth.tolist(), "rank": rank.tolist(), "confidence": log_conf.exp().tolist(),
                    "value": log_value.exp().tolist(), "tree_index": tree_index.tolist(),
                    "parent_tree_index": parent_tree_index}
    return tree


@pytest.mark.parametrize("bug, caught", [("values", "> parent's"), ("orphan", "drafted parent is not kept")])
def test_eagle2_tree_check_catches_a_broken_drafter(monkeypatch, bug, caught):
    """Negative control: the check above fails on a drafter whose path values are not monotone, and on
    one whose kept nodes hang under a parent that is not kept."""
    import eagle2.drafters.eagle2_dynamic as dynamic

    monkeypatch.setattr(dynamic, "tree_from_drafted", partial(_broken_tree_from_drafted, bug=bug))
    failures = []
    for seed in range(3):
        tree = _drafted_tree({"name": "eagle2", "depth": 4, "top_k": 4, "total_tokens": 12}, seed=seed)
        with pytest.raises(AssertionError) as err:
            assert_eagle2_tree_sound(tree, len(tree) - 1)
        failures.append(str(err.value))
    assert all(caught in f for f in failures), failures


def test_eagle2_value_is_product_of_confidences():
    tree = _drafted_tree({"name": "eagle2", "depth": 3, "top_k": 3, "total_tokens": 8})
    conf = torch.tensor([1.0] + tree.confidence[1:].tolist())
    for path in tree.paths():
        running = 1.0
        for node in path[1:]:
            running *= float(conf[node])
            assert abs(running - float(torch.tensor(tree.records["value"])[
                tree.records["tree_index"].index(node)])) < 1e-5


@pytest.mark.parametrize("seed", range(3))
def test_eagle2_keeps_the_budget_best_drafted_nodes_by_path_value(monkeypatch, seed):
    """The rerank step alone, before the tree is built: the nodes handed to the builder are the
    ``total_tokens`` drafted nodes with the highest path value V (the product of confidences from the
    root), ties shallower first; not the highest last-step confidence (which the builder's connectivity
    check would only sometimes notice)."""
    import eagle2.drafters.eagle2_dynamic as dynamic

    handed = {}

    def record(root, tokens, parents, depth, rank, log_conf, log_value, keep, **meta):
        handed.update(log_conf=log_conf, log_value=log_value, depth=depth, keep=keep)
        return DraftTree.root_only(root)

    monkeypatch.setattr(dynamic, "tree_from_drafted", record)
    _drafted_tree({"name": "eagle2", "depth": 4, "top_k": 4, "total_tokens": 12}, seed=seed)
    value, depth = handed["log_value"], handed["depth"]
    best = sorted(range(len(value)), key=lambda i: (-float(value[i]), int(depth[i])))[:12]
    assert handed["keep"].tolist() == sorted(best)
    by_conf = sorted(range(len(value)), key=lambda i: -float(handed["log_conf"][i]))[:12]
    assert sorted(by_conf) != sorted(best)  # the two rankings differ here: the test can tell them apart
