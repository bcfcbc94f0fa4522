"""``train_head.py stage=eval``: the exported drafters of ``train.eval.kinds`` (objectives with an export to
measure: ``objectives/``) measured on the corpus's held-out shards and on MT-bench first turns (``heldout``),
with ``evaluate``'s two measures; ``eval.json`` is written next to each artifact."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from eagle2.training.data import all_sequences, load_sequences, split_shards
from eagle2.training.evaluation.evaluate import write_eval_json
from eagle2.training.evaluation.heldout import mtbench
from eagle2.training.objectives import objectives


def check_kinds(kinds) -> None:
    """``train.eval.kinds``: objectives that declare an ``evaluate`` (one ValueError line otherwise)."""
    known = [o.stage for o in objectives().values() if o.evaluate]
    if any(k not in known for k in kinds):
        raise ValueError(f"train.eval.kinds must list some of {', '.join(known)}, not {list(kinds)}")


def eval_stage(target, tokenizer, cfg, root: Path, kinds=None) -> dict:
    """Measure the exports of ``kinds`` (default ``train.eval.kinds``; module docstring); returns their metrics."""
    ev, export = cfg.train.eval, cfg.train.export
    kinds = tuple(kinds or ev.kinds)
    check_kinds(kinds)
    sets = {"mt_bench": all_sequences(mtbench(target, tokenizer, cfg, root))}
    corpus = root / cfg.train.corpus.out_dir
    if any(corpus.glob("shard_*.safetensors")):  # (the key's name is historical: the corpus's held-out shards)
        sets["alpaca_heldout"] = load_sequences(split_shards(corpus, cfg.train.head.val_fraction)[1])
    else:
        print(f"[eval] no corpus shards in {corpus}: measuring on MT-bench first turns only", flush=True)
    settings = OmegaConf.to_container(ev)
    results = {}
    for kind in kinds:
        objective = objectives()[kind]
        folder = root / export[objective.export_key]
        model = objective.family.load(folder, target)
        metrics = {"target": cfg.model.name, "artifact": str(folder), "settings": settings}
        for name, seqs in sets.items():
            metrics[name] = objective.evaluate(model, target, seqs, ev)
            chain, tf = metrics[name]["chain"], metrics[name]["teacher_forced"]
            print(f"[eval] {kind} on {name}: top1={tf.get('top1', 0):.3f} top4={tf.get('top4', 0):.3f} "
                  f"chain tau={chain['tau']:.3f} ({chain['anchors']} anchors)", flush=True)
        write_eval_json(folder, metrics)
        results[kind] = metrics
    return results
