"""Training objectives, one module each, behind one interface that ``recipe.py`` iterates.

A module of this package that declares ``OBJECTIVE = Objective(...)`` is a ``train_head.py`` stage of that
name; its settings are the section of the same name in ``conf/train/*.yaml``. ``objectives()`` discovers them
by importing the package's modules, so a new objective is its module and its config section, nothing else to
register: the recipe runs it (in ``stage=all`` at its ``order``), the preflight checks its corpus, its
``resume_dir`` and the weights it starts from (``weights``), torchrun may run it (``data_parallel``), and with
``export_key``, ``family`` and ``evaluate`` the eval stage measures its export. ``train_objective`` is the part
every objective's training shares: the corpus split, online features for a token corpus, the loop
(``loop.fit``), the shards it read.

**Joining a joint run** (``objectives/joint.py``: several heads trained on the same batches from ONE target
forward each): an objective declares ``member=Member(setup, export, chain)``, and ``train.joint.heads`` may then
list its stage. ``setup(target, corpus_dir, cfg)`` builds (or continues) its module from its own section
``cfg = train.<stage>`` and returns ``(module, loss_fn, fingerprint_extra)``; ``loss_fn(module, batch, *,
generator, train, with_stats) -> (loss, stats)`` is its loss over one featurized batch (``features``: the
target's last hidden states, ``layer_features``: the inputs of the layers the module taps, ``tokens``,
``valid``, the answer spans), the same function its own stage trains with, so validation (``train=False``: top-1,
top-4) and the per-step stats come from it too. A module that reads tapped layers names them, in the order its
``layer_features`` concatenates them, as its ``feature_layers`` attribute; the joint forward taps the union of its
members' layers once and hands each member its own layers. ``export(module, summary, cfg, root, section)``
writes it through its family's ``save`` to ``train.export.<export_key>`` and ``chain(module, target)`` is its
greedy chain drafter (the chain tau, where validation measures one). ``solo_stage(stage, desc, member)`` is the
stage of an objective trained alone from those same three (P-EAGLE, DFlash, PARD: their differences are their
``Member`` and names); an objective may use it without joining joint runs (no ``member=`` in its ``Objective``).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path

import torch

from eagle2.heads.family import Family
from eagle2.training.data import Sequence, train_val_sequences
from eagle2.training.evaluation.heldout import validation
from eagle2.training.features import featurizer, online_fingerprint
from eagle2.training.loop import fit
from eagle2.training.support import distributed


@dataclass(frozen=True)
class Member:
    """How an objective's module is built, exported and chain-measured: as one head of a joint run (module
    docstring: "Joining a joint run") and, through ``solo_stage``, alone."""
    setup: Callable  # (target, corpus_dir, train.<stage>) -> (module, loss_fn, fingerprint extra)
    export: Callable  # (module, summary, cfg, root, section) -> the exported folder
    chain: Callable | None = None  # (module, target) -> its greedy chain drafter (``evaluate.chain_acceptance``)


@dataclass(frozen=True)
class Objective:
    stage: str  # train_head.py stage=<stage>; its settings: train.<stage>
    title: str  # what the stage's closing line calls what it exported
    run: Callable  # (target, tokenizer, cfg, root) -> exported folder(s), or None when it stopped before its end
    order: int | None = None  # its place in stage=all (None: it runs only when named)
    corpus_key: str = "corpus.out_dir"  # train.<corpus_key>: the corpus it trains on (the preflight looks there)
    data_parallel: bool = True  # torchrun may run it (rank 0 exports)
    export_key: str | None = None  # train.export.<export_key>: where stage=eval finds it (None: eval skips it)
    family: Family | None = None  # the drafter family it trains (eagle2.heads.family): its save exports, its load reads
    evaluate: Callable | None = None  # (module, target, sequences, train.eval) -> metrics
    member: Member | None = None  # how it trains inside a joint run (None: it cannot join one)
    check: Callable | None = None  # (cfg) -> None: its settings checked before the target loads (ValueError, one line)
    weights: tuple[str, ...] = ()  # keys of train.<stage> naming a weights folder it starts from (null: none; checked
    #                                 from the files before the target loads)
    reads: Callable | None = None  # (train cfg) -> other stages whose sections it builds from (whose ``weights`` too)


@lru_cache(maxsize=None)
def objectives() -> dict[str, Objective]:
    """Every declared objective by stage name, those of ``stage=all`` first in their order."""
    package = importlib.import_module(__name__)
    found = [getattr(importlib.import_module(f"{__name__}.{info.name}"), "OBJECTIVE", None)
             for info in pkgutil.iter_modules(package.__path__)]
    found = sorted((o for o in found if o is not None), key=lambda o: (o.order is None, o.order or 0, o.stage))
    return {o.stage: o for o in found}


def module_chain(chain: Callable) -> Callable:
    """A ``Member.chain`` for a chain drafter ``chain(module, seq, anchors, depth)`` that reads nothing of the
    target: (module, target) -> ``chain`` bound to the module."""
    return lambda module, target: partial(chain, module)


def exported(summary: dict) -> bool:
    """Whether a finished training is exported by this process (not stopped early; rank 0 under torchrun)."""
    return not summary["partial"] and distributed.is_main()


def train_objective(module: torch.nn.Module, loss_fn: Callable, target, corpus_dir: str | Path, cfg,
                    out_dir: str | Path, *, desc: str, fingerprint_extra: dict | None = None, tap_layers=(),
                    val_seqs: list[Sequence] | None = None, **kwargs):
    """Train ``module`` on ``loss_fn`` over ``corpus_dir`` with the loop settings ``cfg``; checkpoints and metrics
    go to ``out_dir``. A token corpus gets online features (with the inputs of ``tap_layers``). ``val_seqs``
    replace the corpus's held-out shards as the validation set (those shards still stay out of training);
    ``kwargs`` go to ``loop.fit``. Returns (module in eval mode, summary with the shards it read)."""
    target.requires_grad_(False)
    train_seqs, held_out, shards = train_val_sequences(corpus_dir, cfg.val_fraction, cfg.max_train_sequences,
                                                       cfg.get("resident_shards"))
    featurize = featurizer(target, corpus_dir, cfg, tap_layers)
    summary = fit(module, loss_fn, train_seqs, held_out if val_seqs is None else val_seqs, cfg, out_dir, desc=desc,
                  fingerprint_extra=(fingerprint_extra or {}) | online_fingerprint(featurize), featurize=featurize,
                  **kwargs)
    summary["corpus_shards"] = shards  # what this run read (training.json)
    return module.eval(), summary


def solo_stage(stage: str, desc: str, member: Member) -> Callable:
    """The ``run`` of stage ``stage`` (settings ``train.<stage>``) training ``member``'s module alone: seeded with
    its ``seed``, built by ``member.setup`` on ``train.corpus.out_dir``, trained by ``train_objective`` (tapping
    the module's ``feature_layers``, validated as its ``val_set`` says with ``member.chain``'s tau), exported by
    ``member.export`` when it finished."""

    def run(target, tokenizer, cfg, root: Path) -> Path | None:
        c, corpus = cfg.train[stage], root / cfg.train.corpus.out_dir
        torch.manual_seed(c.seed)
        module, loss_fn, extra = member.setup(target, corpus, c)
        module, summary = train_objective(module, loss_fn, target, corpus, c, root / c.out_dir, desc=desc,
                                          fingerprint_extra=extra, tap_layers=getattr(module, "feature_layers", ()),
                                          stop_after=c.stop_after,
                                          **validation(target, tokenizer, cfg, root, stage, member.chain))
        return member.export(module, summary, cfg, root) if exported(summary) else None
    return run
