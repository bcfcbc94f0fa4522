"""The held-out sets a training run measures itself on (``train.<section>.val_set``) and the headline one.

``mtbench``: the target's greedy answers to MT-bench first turns (``train.eval.mtbench``), built once
(resumable) and reused by the eval stage, Medusa's stage and ``val_set: mtbench`` training. ``validation``
resolves a section's ``val_set``: ``corpus`` (its own held-out shards: top-1/top-4 per validation), a corpus
folder (that corpus's held-out shards: heads trained on different corpora measured on one set) or
``mtbench`` (with the greedy-chain tau too, so the learning curve and the flat-curve stop read the headline
held-out set).
"""

from __future__ import annotations

from pathlib import Path

from eagle2.training.corpora.prompts import mtbench_heldout
from eagle2.training.data import all_sequences, train_val_sequences
from eagle2.training.evaluation.evaluate import chain_tau_measure
from eagle2.training.features import corpus_tap_layers


def mtbench(target, tokenizer, cfg, root: Path) -> Path:
    """The folder of the MT-bench held-out set (built first when missing or unfinished)."""
    mt, corpus = cfg.train.eval.mtbench, cfg.train.corpus
    return mtbench_heldout(target, tokenizer, root / mt.out_dir, template=corpus.template,
                           system_prompt=corpus.system_prompt, max_new_tokens=mt.max_new_tokens,
                           batch_size=mt.batch_size, limit=mt.limit, stop_tokens=corpus.stop_tokens,
                           tap_layers=corpus_tap_layers(target, corpus.get("tap_layers")))


def validation(target, tokenizer, cfg, root: Path, section: str, chain=None) -> dict:
    """``loop.fit``'s validation arguments for ``train.<section>.val_set`` (module docstring); ``chain(module,
    target)`` gives the objective's greedy chain drafter, measured on ``mtbench``."""
    val_set = cfg.train[section].get("val_set", "corpus")
    if cfg.train[section].get("best_by") == "tau" and (val_set != "mtbench" or chain is None):
        raise ValueError(f"train.{section}.best_by: tau needs val_set: mtbench (the greedy-chain tau), not {val_set!r}")
    if val_set == "corpus":
        return {}
    if val_set != "mtbench":
        folder = root / str(val_set)
        if not folder.is_dir():
            raise ValueError(f"train.{section}.val_set must be corpus, mtbench or a corpus folder, not {val_set!r}")
        return {"val_seqs": train_val_sequences(folder, cfg.train[section].val_fraction)[1]}
    seqs = all_sequences(mtbench(target, tokenizer, cfg, root))
    extra = {"val_extra": chain_tau_measure(chain, target, seqs, cfg.train.eval)} if chain else {}
    return {"val_seqs": seqs, **extra}
