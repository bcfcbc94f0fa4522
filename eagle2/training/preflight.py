"""What ``train_head.py`` checks before the target loads: the stage names, and each stage's inputs that an
earlier stage of the same command does not make (a corpus to train on, prompt files to build one from, the
source shards of ``own_answers`` and ``features``, exported artifacts to evaluate, a ``resume_dir`` state
that can be read). Each problem is one ``PreflightError`` line naming the config key, the path and the
stage that makes it; none needs a model.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from eagle2.training.objectives import objectives
from eagle2.training.support.warm_state import read_warm_state

CORPUS_PATTERNS = ("shard_*.safetensors", "tokens_*.npz")  # feature shards, or token shards (online features)


class PreflightError(ValueError):
    """A stage input that is missing or unreadable, found before any model loads."""


def _has_corpus(folder: Path) -> bool:
    return any(any(folder.glob(pattern)) for pattern in CORPUS_PATTERNS)


def _need_corpus(folder: Path, key: str, stage: str, made_by: str) -> None:
    if not _has_corpus(folder):
        raise PreflightError(f"stage={stage} trains on {key}={folder}, which holds no corpus shards "
                             f"({' or '.join(CORPUS_PATTERNS)}): build it first with train_head.py stage={made_by}")


def check_inputs(cfg, root: Path, stages: tuple[str, ...]) -> None:
    """Raise one ``PreflightError`` for the first input of ``stages`` that is missing or unreadable (module
    docstring); an input that an earlier stage of ``stages`` makes is not looked for."""
    train = cfg.train
    for i, stage in enumerate(stages):
        before = set(stages[:i])
        if stage == "corpus":
            prompts = [train.corpus.prompts] if isinstance(train.corpus.prompts, str) else list(train.corpus.prompts)
            missing = [p for p in prompts if not (root / p).is_file()]
            if missing:
                raise PreflightError(f"stage=corpus reads train.corpus.prompts, and {root / missing[0]} does not exist")
        objective = objectives().get(stage)
        if objective is not None and "corpus" not in before:
            key = f"train.{objective.corpus_key}"
            _need_corpus(root / OmegaConf.select(cfg, key), key, stage, "corpus")
        if stage == "own_answers" and "sharegpt" not in before:
            _need_corpus(root / train.own_answers.source, "train.own_answers.source", stage, "sharegpt")
        if stage == "features" and "conversations" not in before:
            _need_corpus(root / train.conversations.out_dir, "train.conversations.out_dir", stage, "conversations")
        if stage == "eval":
            _check_exports(cfg, root, before)
        if objective is not None:
            read_warm_state((train.get(stage) or {}).get("resume_dir"))  # raises WarmStateError


def _check_exports(cfg, root: Path, before: set[str]) -> None:
    """The exported artifacts ``train.eval.kinds`` measures, unless this command trains them first."""
    from eagle2.heads.locations import check_weights_location

    for kind in cfg.train.eval.kinds:
        export_key, stage = getattr(objectives().get(str(kind)), "export_key", None), str(kind)
        if export_key is None or stage in before:
            continue  # an unknown kind is the eval stage's own one-line error
        location = cfg.train.export.get(export_key)
        folder = root / location if location else None
        if folder is None or not folder.is_dir():
            raise PreflightError(f"stage=eval measures train.export.{export_key}={location}, which is not a folder: "
                                 f"train it first (train_head.py stage={stage}) or drop {kind} from train.eval.kinds")
        check_weights_location(folder, f"train.export.{export_key}")
