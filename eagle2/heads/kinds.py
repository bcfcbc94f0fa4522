"""Drafter weight kinds, each declared once, in the heads module of its format, as
``WEIGHT_KIND = WeightKind(key, load, save)``: ``key`` is the model-config key naming where such weights
are (what a ``conf/method`` YAML lists under ``weights``), ``load(location, target)`` reads them for a
target and ``save(module, folder, dtype=None)`` writes them in that format (what training writes).

A kind whose location is not a weights folder (REST's datastore is one ``.npz`` file) gives its own
``check(location, key)``, run before any model loads; the others get ``heads.locations``' folder checks, which
look for one of its ``files`` (best first; the safetensors/bin pair of ``heads.checkpoint`` unless it says).

``weight_kinds()`` discovers them by importing the modules of ``eagle2.heads``: a new kind is one new
heads module, nothing else to register.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from eagle2.heads.checkpoint import WEIGHT_FILES


@dataclass(frozen=True)
class WeightKind:
    key: str  # model-config key, e.g. "head"
    load: Callable  # (location, target) -> module
    save: Callable  # (module, folder, dtype=None) -> folder
    check: Callable | None = None  # (location, key) -> None, raising one line; None: a weights folder's checks
    files: tuple[str, ...] = WEIGHT_FILES  # a weights folder's weight files, best first


@lru_cache(maxsize=None)
def weight_kinds() -> dict[str, WeightKind]:
    """Every declared weight kind, by model-config key."""
    package = importlib.import_module("eagle2.heads")
    kinds = {}
    for info in pkgutil.iter_modules(package.__path__):
        kind = getattr(importlib.import_module(f"eagle2.heads.{info.name}"), "WEIGHT_KIND", None)
        if kind is not None:
            kinds[kind.key] = kind
    return kinds
