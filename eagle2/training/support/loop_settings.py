"""The training loop's settings checked before the target loads: each key a training section may carry
(``train.<stage>``: epochs, learning rate, batches, validation, checkpoints; ``loop.fit`` reads them) with the
values it accepts, so a bad one is one line naming the key instead of a late error, or a silent no-op, after
the target has loaded. A section that leaves a key out keeps the loop's default; the table is the one place
that says what the loop accepts. The checks are ``eagle2.drafters.setting_checks``' (``Check``, ``first_failure``),
as a drafter's settings are."""

from __future__ import annotations

import math

from eagle2.drafters.setting_checks import Check, first_failure, is_int, is_number
from eagle2.training.best import BEST_BY


def _finite(value) -> bool:
    return is_number(value) and math.isfinite(value)


def _checked(valid: str, ok, nullable: bool) -> Check:
    """``ok`` (value -> bool) as a ``Check``; with ``nullable`` null passes too (said as "or null")."""
    return Check(valid + (" or null" if nullable else ""), lambda v, _: (nullable and v is None) or ok(v))


def integer(low: int, nullable: bool = False) -> Check:
    return _checked(f"an integer >= {low}", lambda v: is_int(v) and v >= low, nullable)


def number(low: float, high: float | None = None, nullable: bool = False) -> Check:
    valid = f"a number >= {low}" + (f" and <= {high}" if high is not None else "")
    return _checked(valid, lambda v: _finite(v) and low <= v and (high is None or v <= high), nullable)


def positive(nullable: bool = False) -> Check:
    return _checked("a number > 0", lambda v: _finite(v) and v > 0, nullable)


CHECKS = {
    "epochs": integer(1),
    "max_steps": integer(1, nullable=True),
    "stop_after": integer(1, nullable=True),
    "token_budget": integer(1),
    "max_batch": integer(1),
    "checkpoint_every": integer(1),
    "log_every": integer(1),
    "val_every": integer(1, nullable=True),  # null: at each epoch end
    "val_max_sequences": integer(1, nullable=True),
    "max_train_sequences": integer(1, nullable=True),
    "resident_shards": integer(1, nullable=True),
    "stop_when_flat": integer(0),
    "lr": positive(),
    "grad_clip": positive(nullable=True),
    "warmup": number(0),
    "weight_decay": number(0),
    "min_lr_ratio": number(0, 1),
    "flat_gain": number(0),
    "val_fraction": _checked("a number between 0 and 1 (both excluded)", lambda v: _finite(v) and 0 < v < 1, False),
    "betas": _checked("two numbers in [0, 1)", lambda v: len(v) == 2 and all(_finite(b) and 0 <= b < 1 for b in v),
                      True),
    "best_by": _checked(f"last or one of {', '.join(BEST_BY)}", lambda v: str(v) in ("last", *BEST_BY), True),
}


def check_loop_settings(section, key: str) -> None:
    """Raise one ``ValueError`` line for the first bad loop setting of ``section`` (the config at ``key``)."""
    if section is None:
        return
    failure = first_failure(section, CHECKS)
    if failure is not None:
        name, value, valid = failure
        shown = list(value) if name == "betas" and value is not None and not isinstance(value, str) else value
        raise ValueError(f"{key}.{name}={shown!r} is invalid: must be {valid}")
