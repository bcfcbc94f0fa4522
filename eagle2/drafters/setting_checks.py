"""A drafter's own settings, checked from its method config before any model loads.

A drafter module declares ``CHECKS = {key: check, ...}`` beside its ``build``: each check says what a good value
of ``method.<key>`` is, in words, and tests it (against the whole method config where it depends on another key:
``at_least_key``). The harness finds the module from the method YAML's ``drafter:`` path and runs them
(``eagle2.bench.validation``), so a new drafter's settings are checked by declaring them. A key the config does not
have is not checked (a method config made in code may leave defaults out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Check:
    valid: str  # what a good value is, in words ("an integer >= 1")
    ok: Callable  # (value, method_cfg) -> bool


def integer(minimum: int, null_means: str | None = None) -> Check:
    """An integer >= ``minimum``; null allowed when ``null_means`` says what it means."""
    valid = f"an integer >= {minimum}"
    return Check(f"null ({null_means}) or {valid}" if null_means else valid,
                 lambda v, _: (v is None and null_means is not None) or (is_int(v) and v >= minimum))


def integer_or(word: str, minimum: int) -> Check:
    """An integer >= ``minimum`` or the word ``word`` (``auto``)."""
    return Check(f"an integer >= {minimum} or {word}", lambda v, _: v == word or (is_int(v) and v >= minimum))


def number(low: float, high: float | None = None, *, above: bool = False) -> Check:
    """A number >= ``low`` (> with ``above``), and <= ``high`` when given."""
    valid = f"a number {'>' if above else '>='} {low}" + (f" and <= {high}" if high is not None else "")
    return Check(valid, lambda v, _: is_number(v) and (v > low if above else v >= low)
                 and (high is None or v <= high))


def boolean() -> Check:
    return Check("true or false", lambda v, _: isinstance(v, bool))


def path(null_means: str) -> Check:
    """A path (a non-empty string), or null meaning ``null_means``."""
    return Check(f"null ({null_means}) or a path", lambda v, _: v is None or (isinstance(v, str) and bool(v.strip())))


def only_with(other: str, value) -> Check:
    """true or false, true only where the config's ``other`` key is ``value`` (``adaptive_depth`` needs
    ``total_tokens=auto``)."""
    return Check(f"true or false, true only with method.{other}={value}",
                 lambda v, cfg: isinstance(v, bool) and (not v or cfg.get(other) == value))


def at_least_key(other: str, minimum: int) -> Check:
    """An integer >= ``minimum`` and >= the config's ``other`` key (``max_span`` >= ``min_span``)."""
    def ok(v, cfg) -> bool:
        low = cfg.get(other)
        return is_int(v) and v >= minimum and (not is_int(low) or v >= low)
    return Check(f"an integer >= {minimum} and >= method.{other}", ok)


def first_failure(method_cfg, checks: dict[str, Check]) -> tuple[str, object, str] | None:
    """(key, value, what it must be) of the first declared setting ``method_cfg`` holds a bad value of; None when
    every one is good."""
    for key, check in checks.items():
        if key in method_cfg and not check.ok(method_cfg.get(key), method_cfg):
            return key, method_cfg.get(key), check.valid
    return None
