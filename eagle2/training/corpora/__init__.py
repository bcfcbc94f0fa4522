"""Corpus sources, one module each, discovered as ``objectives/`` are: a module that declares ``SOURCE =
CorpusSource(...)`` is a ``train_head.py`` stage whose ``build`` reads its section of ``conf/train/*.yaml``. A new
source is its module and its config section: the recipe lists and runs it, the preflight checks the files its
section names and the shards of the source it reads. ``generate`` is the one batched decoder they answer with;
the formats they write are ``shards.py``'s."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from eagle2.training.support.declarations import declared


@dataclass(frozen=True)
class CorpusSource:
    stage: str  # train_head.py stage=<stage>
    title: str  # what it makes (the stage's closing line, the stage list)
    build: Callable  # (target, tokenizer, train.<section>, root) -> the folder it wrote (resumable)
    section: str | None = None  # train.<section>: its settings (None: train.<stage>)
    order: int | None = None  # its place in stage=all, before every objective (None: it runs only when named)
    needs: str | None = None  # the stage whose shards it reads, at train.<section>.source (the preflight looks there)
    files: tuple[str, ...] = ()  # keys of its section naming input files (a path or a list; the preflight checks them)

    @property
    def settings(self) -> str:  # the config key of its section
        return f"train.{self.section or self.stage}"


@lru_cache(maxsize=None)
def sources() -> dict[str, CorpusSource]:
    """Every declared corpus source by stage name, those of ``stage=all`` first in their order."""
    return {s.stage: s for s in declared(__name__, "SOURCE")}
