"""KV-cache commit and failure safety against a full recompute."""

from __future__ import annotations

import pytest
import torch

from eagle2.core.cache import cache_length, forward_target, keep_tree_path, new_cache
from eagle2.core.tree import DraftTree
from tests.conftest import tiny_llama


@torch.no_grad()
def test_tree_forward_and_commit_match_recompute():
    model = tiny_llama()
    prefix = [3, 9, 4, 7]
    tree = DraftTree(torch.tensor([5, 11, 12, 13, 14]), torch.tensor([-1, 0, 0, 2, 2]))
    cache = new_cache(model)
    forward_target(model, torch.tensor([prefix]), cache)
    hidden = forward_target(model, tree.tokens[None], cache, attention_mask=tree.attention_mask(4, torch.float32),
                            position_ids=tree.position_ids(4))
    for path in tree.paths():  # each root-to-leaf path equals a plain causal forward of that sequence
        seq = prefix + [int(tree.tokens[i]) for i in path]
        full = forward_target(model, torch.tensor([seq]), new_cache(model))
        assert torch.allclose(hidden[0, path], full[0, len(prefix):], atol=1e-5)
    keep_tree_path(cache, 4, [0, 2, 4])
    assert cache_length(cache) == 7
    nxt = forward_target(model, torch.tensor([[20]]), cache)
    full = forward_target(model, torch.tensor([prefix + [5, 12, 14, 20]]), new_cache(model))
    assert torch.allclose(nxt[0, -1], full[0, -1], atol=1e-5)


@torch.no_grad()
def test_forward_that_raises_leaves_cache_unchanged():
    model = tiny_llama()
    cache = new_cache(model)
    forward_target(model, torch.tensor([[3, 4, 5]]), cache)
    before = [layer.keys.clone() for layer in cache.layers]
    bad_mask = torch.zeros(1, 1, 2, 99)  # wrong key length: the attention raises after some layers ran
    with pytest.raises(RuntimeError):
        forward_target(model, torch.tensor([[6, 7]]), cache, attention_mask=bad_mask,
                       position_ids=torch.tensor([[3, 4]]))
    assert cache_length(cache) == 3
    assert all(torch.equal(a, layer.keys) for a, layer in zip(before, cache.layers))
