"""Declarations found by importing a package's modules: every module of ``corpora/`` that declares ``SOURCE``
and of ``objectives/`` that declares ``OBJECTIVE`` is a ``train_head.py`` stage, with nothing to register."""

from __future__ import annotations

import importlib
import pkgutil


def declared(package: str, name: str) -> list:
    """The ``name`` of every module of ``package`` that declares one: those with an ``order`` (their place in
    ``stage=all``) first, in it, then the rest by ``stage``."""
    modules = pkgutil.iter_modules(importlib.import_module(package).__path__)
    found = [getattr(importlib.import_module(f"{package}.{info.name}"), name, None) for info in modules]
    return sorted((d for d in found if d is not None), key=lambda d: (d.order is None, d.order or 0, d.stage))
