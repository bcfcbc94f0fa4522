"""The stages of ``train_head.py``, each reading its section of ``conf/train/*.yaml`` and resuming where it
stopped: the corpus sources (corpus | conversations | sharegpt | own_answers), the feature shards of a token
corpus (features), every training objective (``objectives/``: head | eagle3 | draft | medusa | joint | hydra)
and the eval stage. ``all`` runs corpus, the objectives of ``stage=all`` in their order, then eval."""

from __future__ import annotations

from pathlib import Path

from eagle2.training import distributed
from eagle2.training.objectives import objectives

OBJECTIVES = objectives()
STAGES = ("corpus", *(o.stage for o in OBJECTIVES.values() if o.order is not None), "eval")
# run only when named (not part of ``all``)
EXTRA_STAGES = ("conversations", "features", "sharegpt", "own_answers",
                *(o.stage for o in OBJECTIVES.values() if o.order is None))
DATA_PARALLEL_STAGES = tuple(o.stage for o in OBJECTIVES.values() if o.data_parallel)  # torchrun may run these


def stages_of(stage: str) -> tuple[str, ...]:
    """The stages that ``stage`` (one of ``STAGES`` or ``all``) runs, in order."""
    stages = STAGES if stage == "all" else (stage,)
    if any(s not in STAGES + EXTRA_STAGES for s in stages):
        raise ValueError(f"unknown stage {stage!r}; choose one of {', '.join(STAGES + EXTRA_STAGES)} or all")
    return stages


def corpus_stage(target, tokenizer, corpus_cfg, root: Path) -> Path:
    """Build (or finish) the self-distillation corpus of ``conf/train/*.yaml``."""
    from eagle2.training.corpora.prompts import build_corpus, training_records
    from eagle2.training.features import corpus_tap_layers

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

    from eagle2.training.corpora.conversations import generate_conversations

    c = conv_cfg
    return generate_conversations(
        target, tokenizer, root / c.out_dir, categories=OmegaConf.to_container(c.categories),
        follow_ups=list(c.follow_ups), template=c.template, system_prompt=c.system_prompt, n_batches=c.n_batches,
        batch_size=c.batch_size, max_user_tokens=c.max_user_tokens, min_user_tokens=c.min_user_tokens,
        max_answer_tokens=c.max_answer_tokens, temperature=c.temperature, top_p=c.top_p, seed=c.seed,
        stop_tokens=c.stop_tokens, ngram=c.ngram, near_duplicate=c.near_duplicate)


def sharegpt_stage(tokenizer, sg_cfg, root: Path) -> Path:
    """ShareGPT token shards (``train.sharegpt``): the dataset's own answers, rendered by the target's template."""
    from eagle2.training.corpora.sharegpt import build_sharegpt_shards

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
    from eagle2.training.corpora.own_answers import build_own_answer_shards

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
    from eagle2.training.features import corpus_tap_layers, tokens_to_features

    f = conv_cfg.features
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return tokens_to_features(target, root / conv_cfg.out_dir, root / f.out_dir, pad_id=pad_id,
                              tap_layers=corpus_tap_layers(target, f.get("tap_layers")),
                              token_budget=f.token_budget, max_shards=f.max_shards)


def eval_stage(target, tokenizer, cfg, root: Path, kinds=None) -> dict:
    """Evaluate the exported drafters of ``train.eval.kinds`` (objectives with an export to measure) on the
    corpus's held-out shards and on MT-bench first turns (answered greedily by the target); write ``eval.json``
    next to each artifact."""
    from omegaconf import OmegaConf

    from eagle2.training.data import all_sequences, load_sequences, split_shards
    from eagle2.training.evaluate import write_eval_json
    from eagle2.training.heldout import mtbench

    ev, export = cfg.train.eval, cfg.train.export
    kinds = tuple(kinds or ev.kinds)
    known = [o.stage for o in OBJECTIVES.values() if o.evaluate]
    if any(k not in known for k in kinds):
        raise ValueError(f"train.eval.kinds must list some of {', '.join(known)}, not {list(kinds)}")
    sets = {"mt_bench": all_sequences(mtbench(target, tokenizer, cfg, root))}
    corpus = root / cfg.train.corpus.out_dir
    if any(corpus.glob("shard_*.safetensors")):  # (the key's name is historical: the corpus's held-out shards)
        sets["alpaca_heldout"] = load_sequences(split_shards(corpus, cfg.train.head.val_fraction)[1])
    else:
        print(f"[eval] no corpus shards in {corpus}: measuring on MT-bench first turns only", flush=True)
    settings = OmegaConf.to_container(ev)
    results = {}
    for kind in kinds:
        objective = OBJECTIVES[kind]
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
    for objective in OBJECTIVES.values():
        if objective.stage in stages:
            _say(_exported(objective.title, objective.run(target, tokenizer, cfg, root)))
    if "eval" in stages:
        eval_stage(target, tokenizer, cfg, root)
