"""KV-cache commit and failure safety against a full recompute."""

from __future__ import annotations

import pytest
import torch

from eagle2.core.cache import CHUNK, InPlaceLayer, cache_length, forward_target, keep_tree_path, new_cache
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


@torch.no_grad()
def test_non_prefix_path_is_committed_in_place_in_every_layer():
    """A depth-major tree whose accepted path is not a prefix of the flattened tree: after the commit
    every layer's buffer holds, in place, the prefix and then exactly the accepted nodes' entries."""
    model = tiny_llama(layers=3)
    cache = new_cache(model)
    assert all(isinstance(layer, InPlaceLayer) for layer in cache.layers)
    forward_target(model, torch.tensor([[3, 9, 4, 7]]), cache)
    tree = DraftTree(torch.tensor([5, 11, 12, 13, 14, 15]), torch.tensor([-1, 0, 0, 1, 2, 4]))
    forward_target(model, tree.tokens[None], cache, attention_mask=tree.attention_mask(4, torch.float32),
                   position_ids=tree.position_ids(4))
    buffers = [(layer._k, layer._v) for layer in cache.layers]
    tree_entries = [(layer.keys[:, :, 4:].clone(), layer.values[:, :, 4:].clone()) for layer in cache.layers]
    prefix = [(layer.keys[:, :, :4].clone(), layer.values[:, :, :4].clone()) for layer in cache.layers]
    path = [0, 2, 4, 5]
    keep_tree_path(cache, 4, path)
    assert cache_length(cache) == 8
    for layer, (k_buf, v_buf), (k_tree, v_tree), (k_pre, v_pre) in zip(cache.layers, buffers, tree_entries, prefix):
        assert layer._k is k_buf and layer._v is v_buf  # the same buffers: written in place, not re-made
        assert torch.equal(layer.keys[:, :, :4], k_pre) and torch.equal(layer.values[:, :, :4], v_pre)
        assert torch.equal(layer.keys[:, :, 4:], k_tree[:, :, path])
        assert torch.equal(layer.values[:, :, 4:], v_tree[:, :, path])
    nxt = forward_target(model, torch.tensor([[20]]), cache)  # and decoding goes on from the right state
    full = forward_target(model, torch.tensor([[3, 9, 4, 7, 5, 12, 14, 15, 20]]), new_cache(model))
    assert torch.allclose(nxt[0, -1], full[0, -1], atol=1e-5)


@torch.no_grad()
def test_buffer_grows_in_chunks_and_keeps_its_entries():
    model = tiny_llama()
    cache, stock = new_cache(model), new_cache(model, in_place=False)
    ids = torch.randint(64, (1, CHUNK + 7))
    for chunk in (ids[:, :CHUNK - 1], ids[:, CHUNK - 1:CHUNK + 2], ids[:, CHUNK + 2:]):  # crosses one boundary
        a, b = forward_target(model, chunk, cache), forward_target(model, chunk, stock)
        assert torch.allclose(a, b, atol=1e-6)
    assert cache.layers[0].capacity() == 2 * CHUNK and cache_length(cache) == CHUNK + 7
    for layer, ref in zip(cache.layers, stock.layers):
        assert torch.equal(layer.keys, ref.keys) and torch.equal(layer.values, ref.values)


def test_grown_buffer_keeps_every_entry_over_garbage(nan_empty):
    """The growth copies every live entry: a new buffer starting as NaN would show any entry left behind."""
    model = tiny_llama()
    cache, stock = new_cache(model), new_cache(model, in_place=False)
    ids = torch.randint(64, (1, CHUNK + 3))
    for chunk in (ids[:, :CHUNK], ids[:, CHUNK:]):  # the second forward grows a full buffer
        forward_target(model, chunk, cache), forward_target(model, chunk, stock)
    assert cache.layers[0].capacity() == 2 * CHUNK
    for layer, ref in zip(cache.layers, stock.layers):
        assert not layer.keys.isnan().any() and torch.equal(layer.keys, ref.keys)
        assert torch.equal(layer.values, ref.values)


@pytest.mark.parametrize("first", [1, CHUNK - 1, CHUNK])
def test_one_entry_at_a_time_across_a_chunk_boundary_keeps_every_entry(first):
    """Decoding writes one position per step: the step that writes the first position past a full buffer must
    grow it before writing (a buffer that grows one position late drops that entry, or the next)."""
    layer = InPlaceLayer()
    entry = lambda i: torch.full((1, 2, 1, 4), float(i))  # noqa: E731  (position i holds the value i)
    block = torch.arange(first, dtype=torch.float32).view(1, 1, first, 1).expand(1, 2, first, 4)
    layer.update(block, block)  # a prefill of ``first`` positions, then steps of one
    for i in range(first, CHUNK + 3):
        keys, values = layer.update(entry(i), entry(i))
        assert keys.shape[-2] == i + 1 == layer.length <= layer.capacity()
        assert torch.equal(keys[0, 0, :, 0], torch.arange(i + 1, dtype=torch.float32)), f"after writing position {i}"
        assert torch.equal(values, keys)
    assert layer.capacity() == 2 * CHUNK


@torch.no_grad()
def test_decoding_token_by_token_past_a_full_chunk_matches_the_stock_cache():
    model = tiny_llama()
    cache, stock = new_cache(model), new_cache(model, in_place=False)
    ids = torch.randint(64, (1, CHUNK + 3))
    chunks = [ids[:, :CHUNK]] + [ids[:, i:i + 1] for i in range(CHUNK, CHUNK + 3)]  # a full buffer, then steps
    for chunk in chunks:
        assert torch.allclose(forward_target(model, chunk, cache), forward_target(model, chunk, stock), atol=1e-6)
    for layer, ref in zip(cache.layers, stock.layers):
        assert torch.equal(layer.keys, ref.keys) and torch.equal(layer.values, ref.values)
