"""Checks of a run's config where it is read, before any model loads: each bad value is one
``ConfigError`` line naming the key, the value and its valid range, and a bad question file is one
``QuestionFileError`` line naming the file and line (``eagle2.prompts.questions.check_question_file``).

The method's own keys are checked by meaning (``METHOD_MINIMUMS``: a key means the same in every method
that has it), so a method YAML with a new key of one of these names is checked with no change here; then by the
drafter's own declared checks (its module's ``CHECKS``, ``eagle2.drafters.setting_checks``), found from the method
YAML's ``drafter:`` path."""

from __future__ import annotations

from omegaconf import DictConfig

from eagle2.bench.compile_choice import CHOICES, RESOLVED
from eagle2.bench.known_keys import unknown_key_message
from eagle2.bench.prompt_lengths import POLICIES, PromptTooLongError
from eagle2.core.kernels import KERNELS
from eagle2.core.precision import DTYPES
from eagle2.core.tree import choice_paths
from eagle2.drafters.policy import POLICIES as ROUND_POLICIES
from eagle2.drafters.setting_checks import first_failure
from eagle2.drafters.setting_checks import is_int as _is_int
from eagle2.drafters.setting_checks import is_number as _is_number
from eagle2.heads.locations import WeightLocationError
from eagle2.prompts.questions import QuestionFileError, benchmark_file, check_question_file
from eagle2.registry import method_spec

__all__ = ["ConfigError", "QuestionFileError", "REFUSED", "validate_run_config"]


class ConfigError(ValueError):
    """A config value out of its valid range."""


# refused before anything ran: no row is stored for it
REFUSED = (ConfigError, QuestionFileError, WeightLocationError, PromptTooLongError)


def _bad(key: str, value, valid: str) -> ConfigError:
    return ConfigError(f"{key}={value!r} is invalid: must be {valid}")


def _int(key: str, value, minimum: int, *, nullable: bool = False, null_means: str = "") -> None:
    if value is None and nullable:
        return
    if not _is_int(value) or value < minimum:
        valid = f"an integer >= {minimum}"
        raise _bad(key, value, f"null ({null_means}) or {valid}" if nullable else valid)


# method keys -> (minimum, what null means or None when null is invalid). Keyed by what a key means, not by
# method: every method YAML with one of these keys is checked, and a new method adds nothing here (its new
# integer key, if any, is one line). Not a list of methods.
METHOD_MINIMUMS = {
    "depth": (1, None), "top_k": (1, None), "k": (1, None), "branches": (1, None),
    "max_ngram": (1, "3"), "min_ngram": (1, "1"), "max_total_tokens": (1, "64"),
    "lookup_k": (1, "the tree's depth"), "lookup_max_ngram": (1, "3"), "lookup_min_ngram": (1, "1"),
    "draft_vocab_size": (1, "the full vocabulary"),
}


# every method key checked here by its meaning (the rest each drafter declares in its CHECKS)
CHECKED_BY_MEANING = frozenset(METHOD_MINIMUMS) | {"total_tokens", "draft_temperature", "draft_lm_head_dtype",
                                                    "choices", "policy"}


def validate_method_config(method: DictConfig) -> None:
    """Raise one ConfigError for the first bad value among the method's own keys."""
    for key, (minimum, null_means) in METHOD_MINIMUMS.items():
        if key in method:
            _int(f"method.{key}", method.get(key), minimum, nullable=null_means is not None, null_means=null_means)
    total = method.get("total_tokens")
    if "total_tokens" in method and total != "auto" and (not _is_int(total) or total < 1):
        raise _bad("method.total_tokens", total, "an integer >= 1 or auto")
    for prefix in ("", "lookup_"):
        low, high = method.get(prefix + "min_ngram"), method.get(prefix + "max_ngram")
        if _is_int(low) and _is_int(high) and low > high:
            raise _bad(f"method.{prefix}min_ngram", low, f"<= method.{prefix}max_ngram ({high})")
    if "policy" in method and method.get("policy") not in ROUND_POLICIES:  # eagle2.drafters.policy
        raise _bad("method.policy", method.get("policy"), " or ".join(ROUND_POLICIES))
    draft_temperature = method.get("draft_temperature")
    if draft_temperature is not None and (not _is_number(draft_temperature) or draft_temperature < 0):
        raise _bad("method.draft_temperature", draft_temperature, "null (the target's) or a number >= 0")
    lm_head_dtype = method.get("draft_lm_head_dtype")
    if lm_head_dtype is not None and str(lm_head_dtype) not in DTYPES:
        raise _bad("method.draft_lm_head_dtype", lm_head_dtype, f"null (the target's) or one of {', '.join(DTYPES)}")
    if "choices" in method:
        choices = method.get("choices")
        try:
            choice_paths(list(choices))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"method.choices={choices!r} is invalid: {exc}") from None
    validate_drafter_settings(method)


def validate_drafter_settings(method: DictConfig) -> None:
    """The checks the method's drafter module declares (``CHECKS``) beside its ``build``."""
    import importlib

    spec = method_spec(method)
    module = importlib.import_module(spec.drafter.rpartition(".")[0])
    failure = first_failure(method, getattr(module, "CHECKS", {}))
    if failure:
        key, value, valid = failure
        raise _bad(f"method.{key}", value, f"{valid} (conf/method/{spec.name}.yaml)")


def validate_process_settings(cfg: DictConfig) -> None:
    """The settings ``run.py`` and ``train_head.py`` share: ``threads`` and the target's ``model.dtype``."""
    _int("threads", cfg.get("threads"), 1, nullable=True, null_means="torch's default")
    dtype = cfg.model.get("dtype", "auto")
    if str(dtype) != "auto" and str(dtype) not in DTYPES:
        raise _bad("model.dtype", dtype, f"auto or one of {', '.join(DTYPES)}")


def validate_run_config(cfg: DictConfig) -> None:
    """Raise one clear error for the first bad value of a run config (see the module docstring)."""
    unknown = unknown_key_message(cfg)  # a key no config group has (Hydra's + lets it through)
    if unknown:
        raise ConfigError(unknown)
    _int("max_new_tokens", cfg.get("max_new_tokens"), 1)
    validate_process_settings(cfg)
    _int("warmup_tokens", cfg.get("warmup_tokens"), 0, nullable=True, null_means="no warm-up")
    _int("batch_size", cfg.get("batch_size", 1), 1)
    if not isinstance(cfg.get("ignore_eos", False), bool):
        raise _bad("ignore_eos", cfg.get("ignore_eos"), "true or false")
    if cfg.get("too_long_prompts", "fail") not in POLICIES:
        raise _bad("too_long_prompts", cfg.get("too_long_prompts"), " or ".join(POLICIES))
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

    validate_method_config(cfg.method)

    kernels = cfg.model.get("kernels", "auto")
    if kernels not in KERNELS:
        raise _bad("model.kernels", kernels, " or ".join(KERNELS))
    compiled = (cfg.get("engine") or {}).get("compile", "auto")
    if {True: "true", False: "false"}.get(compiled, compiled) not in CHOICES + RESOLVED:
        raise _bad("engine.compile", compiled, " or ".join(CHOICES))

    ds = cfg.dataset
    _int("dataset.limit", ds.get("limit"), 0, nullable=True, null_means="all questions")
    if ds.get("hub"):
        return  # hub questions are checked where they load
    try:
        check_question_file(ds.get("path") or benchmark_file(ds.name))
    except FileNotFoundError as exc:
        raise ConfigError(f"{exc} (dataset.path / dataset={ds.name})") from None
