"""One benchmark run: a model, a method and a dataset from the Hydra config, every question turn
decoded and stored as a row. ``run.py`` is a thin wrapper over ``run``.

Multi-turn questions (MT-bench) see the model's own earlier answers through the chat template.
Finished turns are skipped on a rerun. Before the target loads, the config's keys and values, the drafter
weights' files and every prompt's length are checked (``validation``, ``eagle2.heads.locations``,
``prompt_lengths``). A turn that fails while decoding (a prompt its earlier answers made longer than the
context, an error in a forward) is stored as a failed row with its error, the run goes on and its summary
counts it (``run.py`` then exits non-zero). A run that fails as a whole is stored by
``record_cell_failure`` (called from ``run.py``) as a row with no question.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import torch
from omegaconf import DictConfig

from eagle2.bench import compile_choice
from eagle2.bench.first_use import provide
from eagle2.bench.gpu_facts import reset_peak_memory
from eagle2.bench.methods import build_drafter
from eagle2.bench.models import load_target, load_tokenizer
from eagle2.bench.prompt_lengths import fitting_questions
from eagle2.bench.rows import failed_row, fit_prompt, summarize
from eagle2.bench.turns import decode_turns
from eagle2.core.engine import ContextOverflowError, generate
from eagle2.core.kernels import accelerate, kernels_in_use
from eagle2.core.precision import concrete_dtype
from eagle2.core.sampling import SamplingParams
from eagle2.heads.family import families
from eagle2.prompts.chat import encode_conversation, stop_ids
from eagle2.prompts.questions import PROJECT_ROOT, benchmark_file, load_questions
from eagle2.registry import method_spec
from eagle2.results.store import ResultStore, StoreBusyError, StoreWriteError, config_hash

log = logging.getLogger(__name__)


def resolve_artifact(location: str | None) -> str | None:
    """A relative path is looked up in the working directory, then in the project; else a hub id."""
    if not location:
        return None
    for candidate in (Path(location), PROJECT_ROOT / location):
        if candidate.exists():
            return str(candidate)
    return location


def dataset_questions(cfg: DictConfig) -> list[dict]:
    ds = cfg.dataset
    if ds.get("hub"):
        from eagle2.prompts.questions import load_hub_questions

        return load_hub_questions(ds.hub, ds.limit)
    path = ds.path or benchmark_file(ds.name)
    return load_questions(path, ds.limit)


def drafter_locations(cfg: DictConfig) -> dict[str, str]:
    """Where the drafter weights the method needs (its YAML's ``weights``) are, by model-config key."""
    keys = method_spec(cfg.method).weights
    missing = [key for key in keys if not cfg.model.get(key)]
    if missing:
        raise ValueError(f"model {cfg.model.name} names no model.{missing[0]}, which method={cfg.method.name} needs "
                         f"({families()[missing[0]].doc})")
    return {key: resolve_artifact(cfg.model[key]) for key in keys}


def drafter_fingerprints(cfg: DictConfig) -> dict[str, str | None]:
    """Content hashes of the method's local drafter weights, by model-config key (None: a hub id), once
    their files are checked (``eagle2.heads.locations``: one line for a file, a missing folder, an LFS
    pointer, a damaged header, before the target loads); data that builds itself on first use
    (``eagle2.bench.first_use``: REST's chat datastore) is built first."""
    from eagle2.heads.checkpoint import weights_fingerprint
    from eagle2.heads.locations import check_weights_location

    locations = drafter_locations(cfg)
    for key, location in locations.items():
        location = locations[key] = provide(key, location, cfg.model)  # REST's datastore: built on first use
        kind = families()[key]
        if kind.check is not None:
            kind.check(location, f"model.{key}")
        else:
            check_weights_location(location, f"model.{key}", kind.files)
    return {key: weights_fingerprint(location) for key, location in locations.items()}


def check_same_weights(store: ResultStore, fingerprints: dict[str, str | None]) -> None:
    """Refuse to add rows next to finished rows decoded with other drafter weights under the same config
    (a head re-trained in place keeps its path, so the config hash cannot tell)."""
    other = [r["weights"] for r in store.done.values() if r.get("weights") not in (None, fingerprints)]
    if other:
        raise ValueError(f"{store.rows_path} holds rows decoded with other drafter weights ({other[0]}; "
                         f"now {fingerprints}): the weights changed in place since. Write to a new "
                         "paths.results, or move those rows away, and rerun")


def load_drafter_weights(cfg: DictConfig, target) -> dict:
    """The drafter weights the method needs (its YAML's ``weights``), by model-config key, each read by its
    family's loader (``eagle2.heads.family``), with the target's fast kernels (``model.kernels``) where
    they are modules (a REST datastore is data)."""
    loaded = {key: families()[key].load(location, target) for key, location in drafter_locations(cfg).items()}
    short = bool(cfg.model.get("short_attention", True))
    return {key: accelerate(w, cfg.model.get("kernels", "auto"), short_attention=short)
            if isinstance(w, torch.nn.Module) else w for key, w in loaded.items()}


def _reset_peak_memory(device) -> None:
    """Start this config's peak-memory count (a sweep runs many configs in one process)."""
    reset_peak_memory(device)  # on every GPU: a spread target's peak is over all of them


def record_cell_failure(cfg: DictConfig, exc: BaseException) -> str:
    """Store a run that failed as a whole as one failed row with no question or turn; return where.

    Finished rows are untouched and the next run of the config tries again. A config refused by the
    checks before loading (``validation.REFUSED``) stores nothing: a value the hash leaves out would file
    it with another config's rows. When even the store cannot be written, nothing is stored and the
    reason is returned instead.
    """
    import traceback

    from eagle2.bench.validation import REFUSED

    if isinstance(exc, REFUSED):  # nothing ran; its rows file may be another config's (a value the hash ignores)
        return "nowhere: the config was refused before anything ran"
    if isinstance(exc, (StoreBusyError, StoreWriteError)):  # the store itself is what failed: leave it be
        return "nowhere: " + ("another run owns that rows file" if isinstance(exc, StoreBusyError)
                              else "the rows file cannot be written")
    try:
        cfg = resolved(cfg)
        chash = config_hash(cfg)
        with ResultStore.for_config(cfg, chash) as store:
            store.append(failed_row(cfg, chash, None, None, exc, scope="cell",
                                    traceback="".join(traceback.format_exception(exc))))
        return str(store.rows_path)
    except Exception as store_exc:  # the failure is still reported by the caller
        log.error("could not record the failure: %s", store_exc)
        return f"nowhere: {type(store_exc).__name__}: {store_exc}"


def resolved(cfg: DictConfig) -> DictConfig:
    """A copy of ``cfg`` with ``model.dtype=auto`` made this machine's dtype (hashed, stored in rows); the
    caller's config is left as it was."""
    cfg = copy.deepcopy(cfg)
    cfg.model.dtype = concrete_dtype(cfg.model.dtype, cfg.model.device)
    if cfg.get("engine") is not None:  # engine.compile=auto made this machine's choice (hashed when it compiles)
        cfg.engine.compile = compile_choice.resolve(cfg)
    return cfg


def run(cfg: DictConfig) -> dict:
    """Decode every unfinished question turn; return the summary that is printed. ``cfg`` is not changed."""
    from eagle2.bench.validation import validate_run_config

    validate_run_config(cfg)  # one clear line for a bad value or question file, before any model loads
    cfg = resolved(cfg)
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    questions = dataset_questions(cfg)
    if cfg.get("serving") is not None:  # an open-loop load serves first turns (eagle2.bench.serving_run)
        questions = [{**q, "turns": q["turns"][:1]} for q in questions]
    chash = config_hash(cfg)
    with ResultStore.for_config(cfg, chash) as store:  # one writer per rows file, released on any exit
        todo = [(q, t) for q in questions for t in range(len(q["turns"]))
                if not store.finished(q["question_id"], t)]
        plan = (f"[eagle2] {cfg.model.name} / {cfg.method.name} / {cfg.dataset.name}: {len(questions)} questions, "
                f"{len(todo)} turns to run -> {store.rows_path}")
        if todo:  # the weights' files and the prompts' lengths: a refusal is the run's only line
            fingerprints = drafter_fingerprints(cfg)
            check_same_weights(store, fingerprints)
            questions = fitting_questions(cfg, questions, load_tokenizer(cfg.model), store)  # before the target
        print(plan, flush=True)
        if todo:
            _decode_all(cfg, chash, store, questions, fingerprints)
        summary = summarize(store, questions)
    print(format_summary(cfg, summary), flush=True)
    return summary


def _decode_all(cfg, chash, store, questions, fingerprints: dict) -> None:
    from eagle2.bench.logger import make_logger

    _reset_peak_memory(cfg.model.device)  # peak_memory_mb: this config's weights and decoding only
    target, tokenizer = load_target(cfg.model)
    weights = load_drafter_weights(cfg, target)
    compile_s = compile_choice.prepare(cfg, target, weights)  # the compiled path, compiled here: untimed
    kernels = kernels_in_use(target)
    params = SamplingParams(float(cfg.temperature), float(cfg.top_p), int(cfg.top_k))
    context = int(cfg.model.max_context)
    eos = set() if cfg.get("ignore_eos") else stop_ids(tokenizer, cfg.model.get("stop_tokens"))
    logger = make_logger(cfg, chash)
    run_state: dict = {}  # what drafters learn across this run's turns (SuffixDecoding's global tree)

    def decode(prompt, generator, max_new_tokens=None):
        drafter = build_drafter(cfg.method, target, params, generator, weights=weights, run_state=run_state)
        return generate(target, drafter, prompt, params, int(max_new_tokens or cfg.max_new_tokens), eos, generator,
                        context)

    warm_up(cfg, questions, tokenizer, decode, context)
    run_state.clear()  # recorded turns never draft from the warm-up's own outputs
    schedule = decode_turns
    if cfg.get("serving") is not None:  # experiment=serving: an open-loop load (eagle2.bench.serving_run)
        from eagle2.bench.serving_run import serve_turns as schedule
    schedule(cfg, chash=chash, store=store, questions=questions, target=target, tokenizer=tokenizer,
                 weights=weights, params=params, eos=eos, context=context, fingerprints=fingerprints,
                 kernels=kernels, logger=logger, run_state=run_state, compile_s=compile_s)


def warm_up(cfg, questions: list[dict], tokenizer, decode, context: int) -> None:
    """Untimed warm-up before the first recorded turn: ``warmup_questions`` > 0 decodes the first
    question, every turn with its own earlier answers, that many times (the authors' scripts: 3);
    else one ``warmup_tokens``-token answer to a greeting (0: none)."""
    rounds = int(cfg.get("warmup_questions") or 0)
    system = cfg.model.system_prompt
    if rounds > 0 and questions:
        for _ in range(rounds):
            answers: list[str] = []
            for turn in range(len(questions[0]["turns"])):
                prompt = encode_conversation(tokenizer, cfg.model.template, questions[0]["turns"][: turn + 1],
                                             answers, system)
                try:
                    out = decode(fit_prompt(prompt, cfg, context), None)
                except ContextOverflowError:
                    break
                answers.append(tokenizer.decode(out.output_ids, skip_special_tokens=True))
        return
    if cfg.warmup_tokens:
        warm = encode_conversation(tokenizer, cfg.model.template, ["Hello!"], [], system)
        decode(warm, None, int(cfg.warmup_tokens))


def format_summary(cfg, s: dict) -> str:
    tps = f"{s['tokens_per_s']:.2f}" if s["tokens_per_s"] else "n/a"
    e2e = f"{s['e2e_tokens_per_s']:.2f}" if s.get("e2e_tokens_per_s") else "n/a"
    tau = f"{s['tau']:.2f}" if s["tau"] else "n/a"
    return (f"[eagle2] summary {cfg.model.name}/{cfg.method.name}/{cfg.dataset.name} T={cfg.temperature}: "
            f"{s['turns']} turns, {s.get('failed_turns', 0)} failed, {s['new_tokens']} new tokens, "
            f"{tps} tokens/s (decode), "
            f"{e2e} tokens/s (end to end, prefill included), tau {tau}\n"
            + (_batch_line(s) if s.get("batch_size", 1) > 1 else "") +
            f"[eagle2] rows: {s['results']}")


def _batch_line(s: dict) -> str:
    """The batch's throughput beside what one request sees (rows.summarize, eagle2.results.throughput)."""
    def num(key, unit):
        return f"{s[key]:.2f}{unit}" if s.get(key) is not None else "n/a"
    return (f"[eagle2] batch {s['batch_size']}: {num('throughput_tokens_per_s', ' tokens/s')} throughput (all new "
            f"tokens / the batch's wall span {s['wall_span_s']:.1f} s), {num('request_tokens_per_s', ' tokens/s')} "
            f"per request, {num('mean_latency_s', ' s')} mean request latency\n")
