"""The stages of ``train_head.py``, read from their declarations: the corpus sources (``corpora/``, each
module's ``SOURCE``), the training objectives (``objectives/``, each ``OBJECTIVE``) and the eval stage
(``evaluation/stage.py``). Each reads its section of ``conf/train/*.yaml`` and resumes where it stopped.
``all`` runs the sources, then the objectives, that have an ``order``, in it, then eval; the others run
when named. ``stage_table`` lists them all (``train_head.py stage=list``).

The preflight (``check_inputs``) runs before the target loads (``train_head.py`` checks the settings it shares with
``run.py`` first: ``threads``, ``model.dtype``): each stage's inputs that an earlier stage of the same command does
not make (a source's settings, the files its section names, the shards of the source it reads; an objective's
corpus, its loop's settings (``support.loop_settings``) and its own (its ``check``), the weights it starts from
(its ``weights``, and those of the stages it ``reads``) and ``resume_dir`` state; the kinds eval measures and their
exports), and that no section's ``out_dir`` or ``resume_dir`` names a file. Each problem is one ``ValueError`` line
(``PreflightError``, or the checker's own) naming the config key, the path and the stage that makes it; none needs
a model.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from eagle2.heads.locations import check_weights_location
from eagle2.training.corpora import sources
from eagle2.training.evaluation.stage import check_kinds, eval_stage
from eagle2.training.objectives import objectives
from eagle2.training.support import distributed
from eagle2.training.support.loop_settings import check_loop_settings
from eagle2.training.support.warm_state import read_warm_state

SOURCES = sources()
OBJECTIVES = objectives()
STAGES = tuple(d.stage for d in (*SOURCES.values(), *OBJECTIVES.values()) if d.order is not None) + ("eval",)
EXTRA_STAGES = tuple(d.stage for d in (*SOURCES.values(), *OBJECTIVES.values()) if d.order is None)  # named only
DATA_PARALLEL_STAGES = tuple(o.stage for o in OBJECTIVES.values() if o.data_parallel)  # torchrun may run these
CORPUS_PATTERNS = ("shard_*.safetensors", "tokens_*.npz")  # feature shards, or token shards (online features)
FOLDER_KEYS = ("out_dir", "resume_dir")  # in any stage's section: a folder the stage writes, or resumes from


class PreflightError(ValueError):
    """A stage input that is missing or unreadable, found before any model loads."""


def stages_of(stage: str) -> tuple[str, ...]:
    """The stages that ``stage`` (one of ``STAGES``, ``EXTRA_STAGES`` or ``all``) runs, in order."""
    stages = STAGES if stage == "all" else (stage,)
    if any(s not in STAGES + EXTRA_STAGES for s in stages):
        raise ValueError(f"unknown stage {stage!r}; choose one of {', '.join(STAGES + EXTRA_STAGES)} or all")
    return stages


def stage_table() -> str:
    """Every stage, one line each: its name, its place in ``stage=all`` (-: run only when named), its settings
    and what it makes or trains."""
    what = {s.stage: (s.settings, f"corpus source: {s.title}" + (f" (from stage={s.needs})" if s.needs else ""))
            for s in SOURCES.values()}
    what |= {o.stage: (f"train.{o.stage}", f"objective: {o.title} (trains on train.{o.corpus_key})")
             for o in OBJECTIVES.values()}
    what["eval"] = ("train.eval", "measures the exports of train.eval.kinds")
    place = {stage: str(i + 1) for i, stage in enumerate(STAGES)}
    lines = [f"{'stage':<15}{'all':<5}{'settings':<32}what"]
    lines += [f"{s:<15}{place.get(s, '-'):<5}{what[s][0]:<32}{what[s][1]}" for s in STAGES + EXTRA_STAGES]
    return "\n".join(lines)


def _need_corpus(folder: Path, key: str, stage: str, made_by: str) -> None:
    if folder.is_file():
        raise PreflightError(f"stage={stage} trains on {key}={folder}, which is a file: give the corpus folder "
                             f"(train_head.py stage={made_by} makes one)")
    if not any(any(folder.glob(pattern)) for pattern in CORPUS_PATTERNS):
        raise PreflightError(f"stage={stage} trains on {key}={folder}, which holds no corpus shards "
                             f"({' or '.join(CORPUS_PATTERNS)}): build it first with train_head.py stage={made_by}")


def _check_folders(section, key: str, root: Path) -> None:
    """The section ``key``'s ``FOLDER_KEYS``: not a file."""
    for name in FOLDER_KEYS:
        value = (section or {}).get(name)
        if value and (root / value).is_file():
            raise PreflightError(f"{key}.{name}={value} is a file; give a folder (the stage writes there)"
                                 if name == "out_dir" else f"{key}.{name}={value} is a file; give the folder of a "
                                 "training state (resume.json), or null to start afresh")


def _check_weights(objective, cfg, root: Path) -> None:
    """The weights folders the sections of ``objective`` and of the stages it reads name (its ``weights``)."""
    for stage in (objective.stage, *(objective.reads(cfg.train) if objective.reads else ())):
        section = cfg.train.get(stage) or {}
        for key in OBJECTIVES[stage].weights:
            location = section.get(key)
            if location:  # relative: to the working directory as the loaders read it, else to the project
                check_weights_location(location if Path(location).exists() else root / location,
                                       f"train.{stage}.{key}")


def _check_source(source, cfg, root: Path, before: set[str]) -> None:
    """A source's settings, the input files its section names, and the shards of the source it reads."""
    section = OmegaConf.select(cfg, source.settings)
    if section is None:
        raise PreflightError(f"stage={source.stage} reads its settings from {source.settings}, which this "
                             f"train config ({cfg.train.get('name')}) does not have")
    _check_folders(section, source.settings, root)
    for key in source.files:
        value = section.get(key)
        missing = [p for p in ([value] if isinstance(value, str) else value or []) if not (root / p).is_file()]
        if missing:
            raise PreflightError(f"stage={source.stage} reads {source.settings}.{key}, and {root / missing[0]} "
                                 "does not exist")
    if source.needs and source.needs not in before:
        _need_corpus(root / section.source, f"{source.settings}.source", source.stage, source.needs)


def check_inputs(cfg, root: Path, stages: tuple[str, ...]) -> None:
    """Raise one ``PreflightError`` for the first input of ``stages`` that is missing or unreadable (module
    docstring); an input that an earlier stage of ``stages`` makes is not looked for."""
    for i, stage in enumerate(stages):
        before = set(stages[:i])
        if stage in SOURCES:
            _check_source(SOURCES[stage], cfg, root, before)
        objective = OBJECTIVES.get(stage)
        if objective is not None and "corpus" not in before:
            key = f"train.{objective.corpus_key}"
            _need_corpus(root / OmegaConf.select(cfg, key), key, stage, "corpus")
        if stage == "eval":
            _check_exports(cfg, root, before)
        if objective is not None:
            try:
                check_loop_settings(cfg.train.get(stage), f"train.{stage}")
                if objective.check is not None:
                    objective.check(cfg)
            except ValueError as error:
                raise PreflightError(f"stage={stage}: {error}") from None
        if objective is not None:
            _check_folders(cfg.train.get(stage), f"train.{stage}", root)
            _check_weights(objective, cfg, root)  # raises WeightLocationError
            read_warm_state((cfg.train.get(stage) or {}).get("resume_dir"))  # raises WarmStateError


def _check_exports(cfg, root: Path, before: set[str]) -> None:
    """The exported artifacts ``train.eval.kinds`` measures, unless this command trains them first."""
    check_kinds(cfg.train.eval.kinds)
    for kind in cfg.train.eval.kinds:
        export_key, stage = getattr(OBJECTIVES.get(str(kind)), "export_key", None), str(kind)
        if export_key is None or stage in before:
            continue
        location = cfg.train.export.get(export_key)
        folder = root / location if location else None
        if folder is None or not folder.is_dir():
            raise PreflightError(f"stage=eval measures train.export.{export_key}={location}, which is not a folder: "
                                 f"train it first (train_head.py stage={stage}) or drop {kind} from train.eval.kinds")
        check_weights_location(folder, f"train.export.{export_key}")


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
    """Run ``stage`` (one of ``STAGES``, ``EXTRA_STAGES``) or all of them in order."""
    stages = stages_of(stage)
    for source in SOURCES.values():
        if source.stage in stages:
            folder = source.build(target, tokenizer, OmegaConf.select(cfg, source.settings), root)
            _say(f"[train_head] {source.title}: {folder}")
    for objective in OBJECTIVES.values():
        if objective.stage in stages:
            _say(_exported(objective.title, objective.run(target, tokenizer, cfg, root)))
    if "eval" in stages:
        eval_stage(target, tokenizer, cfg, root)
