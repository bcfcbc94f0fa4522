"""The training loop's settings checked before the target loads: each key a training section may carry
(``train.<stage>``: epochs, learning rate, batches, validation, checkpoints; ``loop.fit`` reads them) with the
values it accepts, so a bad one is one line naming the key instead of a late error, or a silent no-op, after
the target has loaded. A section that leaves a key out keeps the loop's default; the table is the one place
that says what the loop accepts."""

from __future__ import annotations

import math
from numbers import Real

from eagle2.training.best import BEST_BY

# key -> (kind, lowest, highest, whether null is allowed); bounds are inclusive unless noted in the message
RULES = {
    "epochs": ("int", 1, None, False),
    "max_steps": ("int", 1, None, True),
    "stop_after": ("int", 1, None, True),
    "token_budget": ("int", 1, None, False),
    "max_batch": ("int", 1, None, False),
    "checkpoint_every": ("int", 1, None, False),
    "log_every": ("int", 1, None, False),
    "val_every": ("int", 1, None, True),  # null: at each epoch end
    "val_max_sequences": ("int", 1, None, True),
    "max_train_sequences": ("int", 1, None, True),
    "resident_shards": ("int", 1, None, True),
    "stop_when_flat": ("int", 0, None, False),
    "lr": ("positive", 0, None, False),
    "grad_clip": ("positive", 0, None, True),
    "warmup": ("number", 0, None, False),
    "weight_decay": ("number", 0, None, False),
    "min_lr_ratio": ("number", 0, 1, False),
    "flat_gain": ("number", 0, None, False),
    "val_fraction": ("fraction", 0, 1, False),
}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _problem(value, kind: str, low, high) -> str | None:
    """What ``value`` must be instead (None: it is fine)."""
    if kind == "int":
        ok = _is_int(value) and value >= low
        return None if ok else f"an integer >= {low}"
    if not _is_number(value):
        return "a number"
    if kind == "positive":
        return None if value > low else f"a number > {low}"
    if kind == "fraction":
        return None if low < value < high else f"a number between {low} and {high} (both excluded)"
    if value < low or (high is not None and value > high):
        return f"a number >= {low}" + (f" and <= {high}" if high is not None else "")
    return None


def check_loop_settings(section, key: str) -> None:
    """Raise one ``ValueError`` line for the first bad loop setting of ``section`` (the config at ``key``)."""
    if section is None:
        return
    for name, (kind, low, high, nullable) in RULES.items():
        if name not in section:
            continue
        value = section.get(name)
        if value is None and nullable:
            continue
        problem = _problem(value, kind, low, high)
        if problem:
            raise ValueError(f"{key}.{name}={value!r} is invalid: must be {problem}"
                             + (" or null" if nullable else ""))
    betas = section.get("betas") if "betas" in section else None
    if betas is not None and (len(betas) != 2 or not all(_is_number(b) and 0 <= b < 1 for b in betas)):
        raise ValueError(f"{key}.betas={list(betas)!r} is invalid: must be two numbers in [0, 1)")
    best_by = section.get("best_by") if "best_by" in section else None
    if best_by is not None and str(best_by) not in ("last", *BEST_BY):
        raise ValueError(f"{key}.best_by={best_by!r} is invalid: must be last or one of {', '.join(BEST_BY)}")
