"""Corpus sources, one module each, discovered as ``objectives/`` are.

A module of this package that declares ``SOURCE = CorpusSource(...)`` is a ``train_head.py`` stage of that
name; its settings are the section ``train.<section>`` of ``conf/train/*.yaml``, which its ``build`` reads.
``sources()`` finds them by importing the package's modules, so a new source is its module and its config
section, nothing else to register: the recipe lists and runs it (in ``stage=all`` at its ``order``), and the
preflight checks the input files its section names (``files``) and the shards of the source it reads
(``needs``, at its section's ``source`` key). The sources: ``prompts`` (stage ``corpus``: instruction prompts
answered by the target, or the dataset's own answers; MT-bench's held-out set), ``sharegpt`` (ShareGPT
conversations with their own answers), ``conversations`` (two-turn self-instruct conversations),
``own_answers`` (ShareGPT's user turns answered by the target), ``feature_shards`` (stage ``features``: a token
corpus's feature shards); ``generate`` is the one batched decoder they answer with. The formats they write
are ``shards.py``'s.
"""

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
    section: str | None = None  # train.<section>: its settings (None: the stage's name)
    order: int | None = None  # its place in stage=all, before every objective (None: it runs only when named)
    needs: str | None = None  # the stage whose shards it reads, at train.<section>.source (the preflight looks there)
    files: tuple[str, ...] = ()  # keys of its section naming input files (a path or a list; the preflight checks them)

    @property
    def settings(self) -> str:
        """The config key of its section."""
        return f"train.{self.section or self.stage}"


@lru_cache(maxsize=None)
def sources() -> dict[str, CorpusSource]:
    """Every declared corpus source by stage name, those of ``stage=all`` first in their order."""
    return {s.stage: s for s in declared(__name__, "SOURCE")}
