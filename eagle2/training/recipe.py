"""The stages of ``train_head.py`` (corpus | head | eagle3 | draft | medusa | eval, or all of them in that order;
and, outside ``all``, hydra (Hydra heads by the Medusa stage) | conversations | features: the self-instruct
two-turn token corpus and its feature shards),
each reading its section of ``conf/train/*.yaml`` and resuming where it stopped."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eagle2.training import distributed
from eagle2.training.models import export_dtype
from eagle2.training.train import train_draft, train_eagle3_head, train_head, train_joint

STAGES = ("corpus", "head", "eagle3", "draft", "medusa", "eval")
# run only when named (not part of ``all``)
EXTRA_STAGES = ("conversations", "features", "sharegpt", "own_answers", "joint", "hydra")
EVAL_KINDS = {"head": "head", "eagle3": "eagle3_head", "draft": "draft"}  # eval kind -> train.export key
DATA_PARALLEL_STAGES = ("head", "eagle3", "draft", "joint")  # the stages torchrun may run (rank 0 exports)


def stages_of(stage: str) -> tuple[str, ...]:
    """The stages that ``stage`` (one of ``STAGES`` or ``all``) runs, in order."""
    stages = STAGES if stage == "all" else (stage,)
    if any(s not in STAGES + EXTRA_STAGES for s in stages):
        raise ValueError(f"unknown stage {stage!r}; choose one of {', '.join(STAGES + EXTRA_STAGES)} or all")
    return stages


def corpus_stage(target, tokenizer, corpus_cfg, root: Path) -> Path:
    """Build (or finish) the self-distillation corpus of ``conf/train/*.yaml``."""
    from eagle2.training.corpus import build_corpus, corpus_tap_layers, training_records

    prompt_files = [corpus_cfg.prompts] if isinstance(corpus_cfg.prompts, str) else list(corpus_cfg.prompts)
    records = training_records([root / f for f in prompt_files])
    if corpus_cfg.limit:
        records = records[: int(corpus_cfg.limit)]
    prompts = [p for p, _ in records]
    responses = corpus_cfg.responses
    if responses not in ("self", "dataset"):
        raise ValueError(f"train.corpus.responses must be 'self' or 'dataset', not {responses!r}")
    return build_corpus(target, tokenizer, prompts, root / corpus_cfg.out_dir, template=corpus_cfg.template,
                        system_prompt=corpus_cfg.system_prompt, batch_size=corpus_cfg.batch_size,
                        max_new_tokens=corpus_cfg.max_new_tokens, max_prompt_tokens=corpus_cfg.max_prompt_tokens,
                        temperature=corpus_cfg.temperature, samples_per_prompt=corpus_cfg.samples_per_prompt,
                        seed=corpus_cfg.seed, max_batches=corpus_cfg.max_batches, worker=corpus_cfg.worker,
                        workers=corpus_cfg.workers, stop_tokens=corpus_cfg.stop_tokens,
                        answers=[a for _, a in records] if responses == "dataset" else None,
                        tap_layers=corpus_tap_layers(target, corpus_cfg.get("tap_layers")),
                        only_batches=corpus_cfg.get("batches"))


def conversations_stage(target, tokenizer, conv_cfg, root: Path) -> Path:
    """Generate (or finish) the two-turn self-instruct token corpus of ``train.conversations``."""
    from omegaconf import OmegaConf

    from eagle2.training.conversations import generate_conversations

    c = conv_cfg
    return generate_conversations(
        target, tokenizer, root / c.out_dir, categories=OmegaConf.to_container(c.categories),
        follow_ups=list(c.follow_ups), template=c.template, system_prompt=c.system_prompt, n_batches=c.n_batches,
        batch_size=c.batch_size, max_user_tokens=c.max_user_tokens, min_user_tokens=c.min_user_tokens,
        max_answer_tokens=c.max_answer_tokens, temperature=c.temperature, top_p=c.top_p, seed=c.seed,
        stop_tokens=c.stop_tokens, ngram=c.ngram, near_duplicate=c.near_duplicate)


def sharegpt_stage(tokenizer, sg_cfg, root: Path) -> Path:
    """ShareGPT token shards (``train.sharegpt``): the dataset's own answers, rendered by the target's template."""
    from eagle2.training.sharegpt import build_sharegpt_shards

    c = sg_cfg
    out = root / c.out_dir
    summary = build_sharegpt_shards(tokenizer, out, template=c.template, system_prompt=c.system_prompt,
                                    path=c.path, stop_tokens=c.stop_tokens, max_tokens=c.max_tokens,
                                    per_shard=c.per_shard, limit=c.limit, ngram=c.ngram)
    print(f"[sharegpt] kept {summary['kept']} of {summary['read']} conversations, {summary['tokens']} tokens "
          f"({summary['answer_tokens']} answer); dropped {summary['dropped']}", flush=True)
    return out


def own_answers_stage(target, tokenizer, cfg, root: Path) -> Path:
    """The target's greedy answers to the user turns of the ShareGPT token shards (``train.own_answers``)."""
    from eagle2.prompts.chat import stop_ids
    from eagle2.training.own_answers import build_own_answer_shards

    c = cfg.train.own_answers
    out = root / c.out_dir
    totals = build_own_answer_shards(target, root / c.source, out, stops=stop_ids(tokenizer, c.stop_tokens),
                                     max_prompt_tokens=c.max_prompt_tokens, max_new_tokens=c.max_new_tokens,
                                     batch_size=c.batch_size, shards=c.shards, max_turns=c.get("max_turns"),
                                     max_context_tokens=c.get("max_context_tokens", 1024))
    print(f"[own_answers] {totals['conversations']} conversations ({totals['turns']} turns), {totals['tokens']} "
          f"tokens ({totals['answer_tokens']} answer), {totals['prompt_too_long']} prompts too long, "
          f"{totals['seconds']:.0f} s decoding", flush=True)
    return out


def features_stage(target, tokenizer, conv_cfg, root: Path) -> Path:
    """Teacher-forced feature shards of the token shards in ``train.conversations.out_dir``."""
    from eagle2.training.corpus import corpus_tap_layers
    from eagle2.training.token_shards import tokens_to_features

    f = conv_cfg.features
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return tokens_to_features(target, root / conv_cfg.out_dir, root / f.out_dir, pad_id=pad_id,
                              tap_layers=corpus_tap_layers(target, f.get("tap_layers")),
                              token_budget=f.token_budget, max_shards=f.max_shards)


def _write_training_card(folder: Path, kind: str, cfg, summary: dict, dtype: torch.dtype,
                         section: str | None = None) -> None:
    """``training.json`` beside an export: the corpus and recipe settings (``train.<section>``, default
    ``train.<kind>``), the shards the trainer read (train and held out, as split when it started), the summary."""
    section = section or kind
    from omegaconf import OmegaConf

    summary = dict(summary)
    info = {"kind": kind, "target": cfg.model.name, "corpus": OmegaConf.to_container(cfg.train.corpus),
            "corpus_shards": summary.pop("corpus_shards"), **({"trained_in": section} if section != kind else {}),
            "recipe": OmegaConf.to_container(cfg.train[section]), "stored_dtype": str(dtype).replace("torch.", ""),
            "summary": summary}
    (folder / "training.json").write_text(json.dumps(info, indent=2, default=str))


def _check_size(folder: Path, max_mb: float) -> None:
    size = (folder / "model.safetensors").stat().st_size / 1e6
    if size > max_mb:
        raise RuntimeError(f"{folder}/model.safetensors is {size:.1f} MB, over the {max_mb} MB limit")


def mtbench_heldout(target, tokenizer, cfg, root: Path) -> Path:
    """The headline held-out set (``train.eval.mtbench``): the target's greedy answers to MT-bench first
    turns, built once (resumable) and reused by the eval stage and by ``val_set: mtbench`` training."""
    from eagle2.training.corpus import corpus_tap_layers
    from eagle2.training.evaluate import build_mtbench_heldout

    mt, corpus = cfg.train.eval.mtbench, cfg.train.corpus
    return build_mtbench_heldout(target, tokenizer, root / mt.out_dir, template=corpus.template,
                                 system_prompt=corpus.system_prompt, max_new_tokens=mt.max_new_tokens,
                                 batch_size=mt.batch_size, limit=mt.limit, stop_tokens=corpus.stop_tokens,
                                 tap_layers=corpus_tap_layers(target, corpus.get("tap_layers")))


def validation(target, tokenizer, cfg, root: Path, kind: str) -> dict:
    """The trainer's validation for ``train.<kind>.val_set``: ``corpus`` (its held-out shards: top-1/top-4
    per step), a corpus folder (that corpus's held-out shards: heads trained on different corpora measured on
    one set) or ``mtbench`` (the eval stage's MT-bench first turns, with the greedy-chain tau too, so the
    learning curve and the flat-curve stop read the headline held-out set)."""
    val_set = cfg.train[kind].get("val_set", "corpus")
    if val_set == "corpus":
        return {}
    if val_set != "mtbench":
        folder = root / str(val_set)
        if not folder.is_dir():
            raise ValueError(f"train.{kind}.val_set must be corpus, mtbench or a corpus folder, not {val_set!r}")
        from eagle2.training.data import train_val_sequences

        return {"val_seqs": train_val_sequences(folder, cfg.train[kind].val_fraction)[1]}
    from eagle2.training.data import all_sequences
    from eagle2.training.evaluate import chain_tau_measure

    seqs = all_sequences(mtbench_heldout(target, tokenizer, cfg, root))
    return {"val_seqs": seqs, "val_extra": chain_tau_measure(kind, target, seqs, cfg.train.eval)}


def head_stage(target, tokenizer, cfg, root: Path) -> Path | None:
    """Train the EAGLE head and export it (published format, no embedding) to ``train.export.head``."""
    head, summary = train_head(target, root / cfg.train.corpus.out_dir, cfg.train.head,
                               root / cfg.train.head.out_dir, stop_after=cfg.train.head.stop_after,
                               **validation(target, tokenizer, cfg, root, "head"))
    if summary["partial"] or not distributed.is_main():  # (several processes: rank 0 exports)
        return None
    return export_head(head, summary, cfg, root)


def export_head(head, summary: dict, cfg, root: Path, section: str = "head") -> Path:
    """Store a trained EAGLE head (published format, no embedding) at ``train.export.head`` with its card."""
    from eagle2.heads.eagle_head import save_head
    from eagle2.training.data import tokens_by_frequency

    if head.draft_vocab is None:  # a head continued from another keeps that head's vocabulary
        head.draft_vocab = tokens_by_frequency(root / cfg.train.corpus.out_dir)
    dtype = export_dtype(head, cfg.train.export.head_max_mb, cfg.train.export.get("dtype", "bfloat16"))
    folder = save_head(head, root / cfg.train.export.head, dtype=dtype)
    _check_size(folder, cfg.train.export.head_max_mb)
    _write_training_card(folder, "head", cfg, summary, dtype, section)
    return folder


def eagle3_stage(target, tokenizer, cfg, root: Path) -> Path | None:
    """Train the EAGLE-3 head (``train.eagle3``) and export it (official layout) to ``train.export.eagle3_head``."""
    ecfg = cfg.train.eagle3
    head, summary = train_eagle3_head(target, root / cfg.train.corpus.out_dir, ecfg, root / ecfg.out_dir,
                                      stop_after=ecfg.stop_after, **validation(target, tokenizer, cfg, root, "eagle3"))
    if summary["partial"] or not distributed.is_main():  # (several processes: rank 0 exports)
        return None
    return export_eagle3(head, summary, cfg, root)


def export_eagle3(head, summary: dict, cfg, root: Path, section: str = "eagle3") -> Path:
    """Store a trained EAGLE-3 head (official layout) at ``train.export.eagle3_head`` with its card."""
    from eagle2.heads.eagle3_head import save_eagle3_head

    max_mb = cfg.train.export.eagle3_head_max_mb
    dtype = export_dtype(head, max_mb, cfg.train.export.get("dtype", "bfloat16"))
    folder = save_eagle3_head(head, root / cfg.train.export.eagle3_head, dtype=dtype)
    _check_size(folder, max_mb)
    _write_training_card(folder, "eagle3", cfg, summary, dtype, section)
    return folder


def joint_stage(target, tokenizer, cfg, root: Path) -> list[Path] | None:
    """Train the EAGLE and EAGLE-3 heads together on one target forward per batch (``train.joint``: the loop's
    settings; each head's own from ``train.head`` / ``train.eagle3``) and export both as their stages do."""
    jcfg = cfg.train.joint
    if jcfg.get("val_set", "corpus") == "mtbench":
        raise ValueError("train.joint.val_set: corpus or a corpus folder (the MT-bench chain tau is per head: "
                         "measure it with stage=eval)")
    heads, summary = train_joint(target, root / cfg.train.corpus.out_dir, cfg.train, root / jcfg.out_dir,
                                 stop_after=jcfg.stop_after, **validation(target, tokenizer, cfg, root, "joint"))
    if summary["partial"] or not distributed.is_main():  # (several processes: rank 0 exports)
        return None
    return [export_head(heads["head"], summary, cfg, root, "joint"),
            export_eagle3(heads["eagle3"], summary, cfg, root, "joint")]


def draft_stage(target, cfg, root: Path) -> Path | None:
    """Train the SpS draft model and export it (no embedding / LM head) to ``train.export.draft``."""
    from eagle2.heads.draft_model import save_draft_model

    draft, summary = train_draft(target, root / cfg.train.corpus.out_dir, cfg.train.draft,
                                 root / cfg.train.draft.out_dir, stop_after=cfg.train.draft.stop_after)
    if summary["partial"] or not distributed.is_main():  # (several processes: rank 0 exports)
        return None
    dtype = export_dtype(draft, cfg.train.export.draft_max_mb, cfg.train.export.get("dtype", "bfloat16"))
    folder = save_draft_model(draft, root / cfg.train.export.draft, dtype=dtype)
    _check_size(folder, cfg.train.export.draft_max_mb)
    _write_training_card(folder, "draft", cfg, summary, dtype)
    return folder


def eval_stage(target, tokenizer, cfg, root: Path, kinds=None) -> dict:
    """Evaluate the exported head / draft on the Alpaca held-out shards and on MT-bench first turns
    (answered greedily by the target); write ``eval.json`` next to each artifact."""
    from omegaconf import OmegaConf

    from eagle2.heads.draft_model import load_draft_model
    from eagle2.heads.eagle3_head import load_eagle3_head
    from eagle2.heads.eagle_head import load_head
    from eagle2.training.data import all_sequences, load_sequences, split_shards
    from eagle2.training.evaluate import (
        evaluate_draft,
        evaluate_eagle3_head,
        evaluate_head,
        write_eval_json,
    )

    ev, export = cfg.train.eval, cfg.train.export
    kinds = tuple(kinds or ev.kinds)
    if any(k not in EVAL_KINDS for k in kinds):
        raise ValueError(f"train.eval.kinds must list some of {', '.join(EVAL_KINDS)}, not {list(kinds)}")
    sets = {"mt_bench": all_sequences(mtbench_heldout(target, tokenizer, cfg, root))}
    corpus = root / cfg.train.corpus.out_dir
    if any(corpus.glob("shard_*.safetensors")):  # (the key's name is historical: the corpus's held-out shards)
        sets["alpaca_heldout"] = load_sequences(split_shards(corpus, cfg.train.head.val_fraction)[1])
    else:
        print(f"[eval] no corpus shards in {corpus}: measuring on MT-bench first turns only", flush=True)
    settings = OmegaConf.to_container(ev)
    results = {}
    for kind in kinds:
        folder = root / export[EVAL_KINDS[kind]]
        if kind == "head":
            model, fn = load_head(folder, target), evaluate_head
        elif kind == "eagle3":
            model, fn = load_eagle3_head(folder, target), evaluate_eagle3_head
        else:
            model, fn = load_draft_model(str(folder), target), evaluate_draft
        metrics = {"target": cfg.model.name, "artifact": str(folder), "settings": settings}
        for name, seqs in sets.items():
            metrics[name] = fn(model, target, seqs, ev)
            chain, tf = metrics[name]["chain"], metrics[name]["teacher_forced"]
            print(f"[eval] {kind} on {name}: top1={tf.get('top1', 0):.3f} top4={tf.get('top4', 0):.3f} "
                  f"chain tau={chain['tau']:.3f} ({chain['anchors']} anchors)", flush=True)
        write_eval_json(folder, metrics)
        results[kind] = metrics
    return results


def _say(line: str) -> None:
    """Print a stage's result (rank 0 only, under torchrun)."""
    if distributed.is_main():
        print(line, flush=True)


def _exported(what: str, folder: Path | None) -> str:
    """The line for a training stage's result (None: it stopped before the end, so nothing was exported)."""
    if folder is None:
        return (f"[train_head] {what}: training stopped before its end (stop_after), nothing exported; rerun the "
                "stage to continue from its checkpoint")
    return f"[train_head] {what} exported to {folder}"


def run_stages(target, tokenizer, cfg, root: Path, stage: str = "all") -> None:
    """Run ``stage`` (one of ``STAGES``) or all of them in order."""
    stages = stages_of(stage)
    if "conversations" in stages:
        _say(f"[train_head] conversations: {conversations_stage(target, tokenizer, cfg.train.conversations, root)}")
    if "sharegpt" in stages:
        _say(f"[train_head] sharegpt: {sharegpt_stage(tokenizer, cfg.train.sharegpt, root)}")
    if "own_answers" in stages:
        _say(f"[train_head] own answers: {own_answers_stage(target, tokenizer, cfg, root)}")
    if "features" in stages:
        _say(f"[train_head] features: {features_stage(target, tokenizer, cfg.train.conversations, root)}")
    if "corpus" in stages:
        _say(f"[train_head] corpus: {corpus_stage(target, tokenizer, cfg.train.corpus, root)}")
    if "head" in stages:
        _say(_exported("head", head_stage(target, tokenizer, cfg, root)))
    if "joint" in stages:
        _say(_exported("EAGLE and EAGLE-3 heads", joint_stage(target, tokenizer, cfg, root)))
    if "eagle3" in stages:
        _say(_exported("EAGLE-3 head", eagle3_stage(target, tokenizer, cfg, root)))
    if "draft" in stages:
        _say(_exported("SpS draft", draft_stage(target, cfg, root)))
    if "medusa" in stages:  # trains, exports and evaluates (eagle2/training/medusa.py)
        from eagle2.training.medusa import medusa_stage

        _say(_exported("Medusa heads", medusa_stage(target, tokenizer, cfg, root)))
    if "hydra" in stages:  # the Medusa stage with Hydra heads (eagle2/training/hydra.py)
        from eagle2.training.hydra import HYDRA
        from eagle2.training.medusa import medusa_stage

        _say(_exported("Hydra heads", medusa_stage(target, tokenizer, cfg, root, HYDRA)))
    if "eval" in stages:
        eval_stage(target, tokenizer, cfg, root)
