"""Checks of a run's config where it is read, before any model loads: each bad value is one
``ConfigError`` line naming the key, the value and its valid range, and a bad question file is one
``QuestionFileError`` line naming the file and line (``eagle2.prompts.questions.check_question_file``)."""

from __future__ import annotations

from omegaconf import DictConfig

from eagle2.core.kernels import KERNELS
from eagle2.prompts.questions import QuestionFileError, benchmark_file, check_question_file

__all__ = ["ConfigError", "QuestionFileError", "validate_run_config"]


class ConfigError(ValueError):
    """A config value out of its valid range."""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bad(key: str, value, valid: str) -> ConfigError:
    return ConfigError(f"{key}={value!r} is invalid: must be {valid}")


def _int(key: str, value, minimum: int, *, nullable: bool = False, null_means: str = "") -> None:
    if value is None and nullable:
        return
    if not _is_int(value) or value < minimum:
        valid = f"an integer >= {minimum}"
        raise _bad(key, value, f"null ({null_means}) or {valid}" if nullable else valid)


def validate_run_config(cfg: DictConfig) -> None:
    """Raise one clear error for the first bad value of a run config (see the module docstring)."""
    _int("max_new_tokens", cfg.get("max_new_tokens"), 1)
    _int("threads", cfg.get("threads"), 1, nullable=True, null_means="torch's default")
    _int("warmup_tokens", cfg.get("warmup_tokens"), 0, nullable=True, null_means="no warm-up")
    _int("batch_size", cfg.get("batch_size", 1), 1)
    seed = cfg.get("seed")
    if not _is_int(seed):
        raise _bad("seed", seed, "an integer")
    temperature = cfg.get("temperature")
    if not _is_number(temperature) or temperature < 0:
        raise _bad("temperature", temperature, "a number >= 0 (0 = greedy)")
    top_p = cfg.get("top_p")
    if not _is_number(top_p) or not 0 < top_p <= 1:
        raise _bad("top_p", top_p, "a number in (0, 1] (1 = off)")
    top_k = cfg.get("top_k")
    if not _is_int(top_k) or top_k < 0:
        raise _bad("top_k", top_k, "an integer >= 0 (0 = off)")

    kernels = cfg.model.get("kernels", "auto")
    if kernels not in KERNELS:
        raise _bad("model.kernels", kernels, " or ".join(KERNELS))

    ds = cfg.dataset
    _int("dataset.limit", ds.get("limit"), 0, nullable=True, null_means="all questions")
    if ds.get("hub"):
        return  # hub questions are checked where they load
    path = ds.get("path") or benchmark_file(ds.name)
    check_question_file(path)
