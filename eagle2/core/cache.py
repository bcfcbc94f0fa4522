"""Target forwards and the KV cache, written in place, through the stock transformers Cache API.

Each layer of the cache (``InPlaceLayer``, a transformers ``DynamicLayer``) keeps its keys and values in
one preallocated buffer per layer, shape (batch, kv_heads, capacity, head_dim), grown geometrically in
chunks; a forward writes its entries at positions ``length..`` and the layer's length moves. ``keys`` /
``values`` are views of the first ``length`` positions, so the model code reads them as before.
Cropping moves the length; committing a tree's accepted path copies the accepted entries into place
behind the prefix (``keep_tree_path``); nothing is concatenated per forward. A forward that raises
leaves the cache as it was (its length is moved back; entries past it are never read).

transformers renamed the cache keyword inside 5.x (``past_key_values=`` in 5.17, ``cache=`` from
about 5.24 on); it is chosen once here from the model's forward signature.
"""

from __future__ import annotations

import inspect
from functools import lru_cache

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from eagle2.core.compiled import StaticKV
from eagle2.core.compiled_batch import StaticBatchKV

CHUNK = 256  # positions: a buffer grows to the next multiple of this, at least doubling


class InPlaceLayer(DynamicLayer):
    """One decoder layer's keys and values in a preallocated buffer with a length."""

    def __init__(self, **kwargs):
        self._k = self._v = None
        self.length = 0
        super().__init__(**kwargs)

    # the model code and transformers read (and may assign) ``keys`` / ``values``: views of the live part
    @property
    def keys(self):
        return None if self._k is None else self._k[:, :, : self.length]

    @keys.setter
    def keys(self, value):
        self._k = value
        self.length = 0 if value is None or value.dim() < 3 else value.shape[-2]

    @property
    def values(self):
        return None if self._v is None else self._v[:, :, : self.length]

    @values.setter
    def values(self, value):
        self._v = value

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._k = key_states.new_empty((*key_states.shape[:2], 0, key_states.shape[-1]))
        self._v = value_states.new_empty((*value_states.shape[:2], 0, value_states.shape[-1]))
        self.length = 0
        self.is_initialized = True

    def capacity(self) -> int:
        return 0 if self._k is None else self._k.shape[2]

    def reserve(self, positions: int) -> None:
        """Room for ``positions`` entries (the live ones are copied once into a larger buffer)."""
        if positions <= self.capacity():
            return
        size = max(positions, 2 * self.capacity())
        size = -(-size // CHUNK) * CHUNK
        k = self._k.new_empty((*self._k.shape[:2], size, self._k.shape[-1]))
        v = self._v.new_empty((*self._v.shape[:2], size, self._v.shape[-1]))
        k[:, :, : self.length] = self._k[:, :, : self.length]
        v[:, :, : self.length] = self._v[:, :, : self.length]
        self._k, self._v = k, v

    def place(self, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write entries at positions ``start..`` and end the live part after them."""
        end = start + keys.shape[-2]
        self.reserve(end)
        self._k[:, :, start:end] = keys
        self._v[:, :, start:end] = values
        self.length = end

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.place(self.length, key_states, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def crop(self, max_length: int) -> None:
        """Keep the first ``max_length`` positions (negative: drop that many from the end), as transformers'."""
        if max_length < 0:
            max_length = self.length + max_length
        self.length = max(0, min(self.length, max_length))

    def reset(self) -> None:
        self.length = 0


@lru_cache(maxsize=None)
def _cache_keyword(forward) -> str:
    params = inspect.signature(forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(module, cache) -> dict:
    """``{keyword: cache}`` for this module's forward."""
    return {_cache_keyword(type(module).forward): cache}


def new_cache(model, in_place: bool = True, rows: int = 1) -> DynamicCache:
    """A transformers ``DynamicCache`` for ``model`` whose full-attention layers write in place
    (``in_place=False``: the stock layers, which concatenate on every forward; for comparisons). A model
    with the compiled path (``eagle2.core.compiled.attach``) gets its static cache instead (``rows`` > 1: rows
    of their own, ``eagle2.core.compiled_batch``; a transformers cache takes any batch)."""
    static = getattr(model, "static_decoder", None)
    if static is not None and in_place:
        return static.new_cache() if rows == 1 else StaticBatchKV(static, rows)
    cache = DynamicCache(config=model.config)
    if in_place:
        cache.layers = [InPlaceLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def cache_length(cache) -> int:
    return int(cache.get_seq_length())


def crop(cache, length: int) -> None:
    """Drop every position from ``length`` on (done per layer: ``Cache.crop``'s meaning changed in 5.x)."""
    if isinstance(cache, (StaticKV, StaticBatchKV)):
        return cache.crop(length)
    for layer in cache.layers:
        if isinstance(layer, InPlaceLayer):
            layer.crop(length)
        elif layer.keys is not None and layer.keys.dim() == 4 and layer.keys.shape[2] > length:
            layer.keys = layer.keys[:, :, :length]
            layer.values = layer.values[:, :, :length]


def forward_target(model, input_ids, cache, *, attention_mask=None, position_ids=None) -> torch.Tensor:
    """Run the base decoder (no LM head); return last hidden states after the final norm.

    On any exception the cache is cropped back to its length before the call.
    """
    if isinstance(cache, (StaticKV, StaticBatchKV)):  # the compiled path
        return cache.forward(input_ids, attention_mask, position_ids)
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
    (tree node indices in ascending order, the root first) and drop the other tree entries: the kept
    entries are copied into place behind the prefix, in every layer, and the length moves."""
    if isinstance(cache, StaticKV):
        return cache.keep(prefix_len, nodes)
    end = prefix_len + len(nodes)
    if nodes == list(range(len(nodes))):  # a prefix of the flattened tree: just crop
        crop(cache, end)
        return
    host = torch.tensor(nodes) + prefix_len
    on = {}  # the index on each layer's device (a target over several GPUs keeps its layers' caches on theirs)
    picked = []
    for layer in cache.layers:
        device = layer.keys.device
        idx = on[device] = on[device] if device in on else host.to(device)
        picked.append((layer.keys.index_select(2, idx), layer.values.index_select(2, idx)))
    for layer, (k, v) in zip(cache.layers, picked):  # write only once every selection succeeded
        if isinstance(layer, InPlaceLayer):
            layer.place(prefix_len, k, v)
        else:
            layer.keys = torch.cat([layer.keys[:, :, :prefix_len], k], dim=2)
            layer.values = torch.cat([layer.values[:, :, :prefix_len], v], dim=2)
    assert cache_length(cache) == end
