"""Drafter families, each declared once, in the heads module of its weight format, as
``FAMILY = Family(key, load, save)``. ``key`` is its one name: the model-config key of its weights' location
(``model.<key>``, null in every model config: ``eagle2.bench.family_keys`` stores the keys as the config node
``model/_families``, which ``conf/model/_base.yaml`` lists; ``doc`` says what it names), what a ``conf/method`` YAML
lists under ``weights``, and the stage and section name of a new objective training it (``Objective(family=FAMILY)``,
never the reverse). ``load(location, target)`` reads them, ``save(module, folder, dtype=None)`` writes them
(training exports so).

A family whose location is not a weights folder (REST's datastore is one ``.npz`` file) gives its own
``check(location, key)``, run before any model loads; the others get ``heads.locations``' folder checks, which
look for one of its ``files`` (best first; the safetensors/bin pair of ``heads.checkpoint`` unless it says).
``fixture`` names (``"module:function"``, imported only by the tests) the writer of a random checkpoint in its
published format for a small target: ``(folder, target_config, seed) -> location``.

``families()`` discovers them by importing the modules of ``eagle2.heads``: nothing else to register.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from eagle2.heads.checkpoint import WEIGHT_FILES


@dataclass(frozen=True)
class Family:
    key: str  # model-config key = weight kind, e.g. "head"
    load: Callable  # (location, target) -> module
    save: Callable  # (module, folder, dtype=None, **config) -> folder
    check: Callable | None = None  # (location, key) -> None, raising one line; None: a weights folder's checks
    files: tuple[str, ...] = WEIGHT_FILES  # a weights folder's weight files, best first
    fixture: str | None = None  # "module:function" writing a random checkpoint (tests); None: the zoo skips it
    doc: str = ""  # what model.<key> names, e.g. "EAGLE head (hub id or local folder) for method=eagle/eagle2"


@lru_cache(maxsize=None)
def families() -> dict[str, Family]:
    """Every declared drafter family, by model-config key."""
    package = importlib.import_module("eagle2.heads")
    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        family = getattr(importlib.import_module(f"eagle2.heads.{info.name}"), "FAMILY", None)
        if family is not None:
            found[family.key] = family
    return found
