"""Target forwards and KV-cache bookkeeping through the stock transformers API.

transformers renamed the cache keyword inside 5.x (``past_key_values=`` in 5.17, ``cache=`` from
about 5.24 on); it is chosen once here from the model's forward signature. Per-layer tensors live in
``cache.layers[i].keys / .values`` with shape (batch, kv_heads, seq, head_dim). Keeping an accepted
path is an ``index_select`` along the sequence axis of every layer (``keep_tree_path``), and a forward
that raises leaves the cache as it was before the forward.
"""

from __future__ import annotations

import inspect
from functools import lru_cache

import torch
from transformers import DynamicCache


@lru_cache(maxsize=None)
def _cache_keyword(forward) -> str:
    params = inspect.signature(forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(module, cache) -> dict:
    """``{keyword: cache}`` for this module's forward."""
    return {_cache_keyword(type(module).forward): cache}


def new_cache(model) -> DynamicCache:
    return DynamicCache(config=model.config)


def cache_length(cache) -> int:
    return int(cache.get_seq_length())


def crop(cache, length: int) -> None:
    """Drop every position from ``length`` on (done per layer: ``Cache.crop``'s meaning changed in 5.x)."""
    if cache_length(cache) <= length:
        return
    for layer in cache.layers:
        layer.keys = layer.keys[:, :, :length]
        layer.values = layer.values[:, :, :length]


def forward_target(model, input_ids, cache, *, attention_mask=None, position_ids=None) -> torch.Tensor:
    """Run the base decoder (no LM head); return last hidden states after the final norm.

    On any exception the cache is cropped back to its length before the call.
    """
    base = model.base_model
    before = cache_length(cache)
    try:
        out = base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=True, **cache_kwargs(base, cache))
    except BaseException:
        crop(cache, before)
        raise
    return out.last_hidden_state


def keep_tree_path(cache, prefix_len: int, nodes: list[int]) -> None:
    """After a verify forward over a tree at positions prefix_len.., keep the prefix and ``nodes``
    (tree node indices in ascending order, the root first) and drop the other tree entries."""
    if nodes == list(range(len(nodes))):  # a prefix of the flattened tree: just crop
        crop(cache, prefix_len + len(nodes))
        return
    idx = torch.tensor(nodes, device=cache.layers[0].keys.device) + prefix_len
    end = prefix_len + len(nodes)
    selected = [(layer.keys.index_select(2, idx), layer.values.index_select(2, idx)) for layer in cache.layers]
    for layer, (k, v) in zip(cache.layers, selected):  # assign only once every selection succeeded
        layer.keys = torch.cat([layer.keys[:, :, :prefix_len], k], dim=2)
        layer.values = torch.cat([layer.values[:, :, :prefix_len], v], dim=2)
    assert cache_length(cache) == end
