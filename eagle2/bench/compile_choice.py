"""``engine.compile``: whether a run decodes through the compiled path (``eagle2.core.compiled``).

``true`` compiles the target's forward (a target the path does not cover is refused in one line), a draft
language model's (SpS) and the draft heads' (EAGLE, EAGLE-2, EAGLE-3: ``eagle2.heads.static_head``; Medusa,
Hydra: ``eagle2.heads.compiled_stack``); under batching the target's B-row forward
(``eagle2.core.compiled_batch``) and the EAGLE heads' over B-row buffers (``eagle2.heads.static_head_batch``,
the rows drafting together), a draft model and Medusa / Hydra staying eager. ``false`` keeps the eager
forwards, ``auto`` compiles where this machine kind measured it faster: ``AUTO_COMPILE`` lists those kinds
(``make bench-floor`` measures T(1) eager and compiled side by side and writes the figures to
``docs/results/floor/<cpu-kind>.md``). ``auto`` never compiles for batched decoding (``make bench-floor``, the
measurement behind it, is of batch 1) or on a device other than a CPU (the CUDA-graph path is not built yet).

Rows record the choice (``compile``: ``true``, ``false``, ``auto:true`` or ``auto:false``) and the compile
seconds spent before any timed section (``compile_s``; None when nothing was compiled).
"""

from __future__ import annotations

from eagle2.core.cpu import cpu_kind

CHOICES = ("auto", "true", "false")
RESOLVED = ("auto:true", "auto:false")  # what ``resolve`` makes of auto on this machine
# Machine kinds where ``auto`` compiles (docs/results/floor/<kind>.md, make bench-floor). None: on the bf16-native
# page the compiled T(1) is faster than the eager one (with the packed linears and the short-query attention in
# the graph), but a process's first compile (~60-75 s for SmolLM2 and a head; ~10 s from the disk cache) costs
# more than it saves on a short run (``make demo``'s ~1,000 tokens save ~6 s), and ``auto`` does not weigh a
# run's length: ``engine.compile=true`` is the setting for long runs and sweeps.
AUTO_COMPILE: tuple[str, ...] = ()


def choice(cfg) -> str:
    """``engine.compile`` as one of ``CHOICES`` or ``RESOLVED`` (a YAML bool read as its name)."""
    value = (cfg.get("engine") or {}).get("compile", "auto")
    value = {True: "true", False: "false"}.get(value, value)
    if value not in CHOICES + RESOLVED:
        raise ValueError(f"engine.compile={value!r}: choose auto, true or false")
    return value


def decide(cfg) -> bool:
    """Whether this run compiles: ``true``, or ``auto`` on a batch-1 CPU run of a kind in ``AUTO_COMPILE``."""
    picked = choice(cfg)
    if picked != "auto":
        return picked.endswith("true")
    batch_one = int(cfg.get("batch_size") or 1) == 1
    on_cpu = str(cfg.model.get("device", "cpu")).startswith("cpu")
    return batch_one and on_cpu and cpu_kind() in AUTO_COMPILE


def resolve(cfg) -> str:
    """What the run uses and rows store in ``compile``: the setting, and for ``auto`` what it chose."""
    picked = choice(cfg)
    return f"auto:{str(decide(cfg)).lower()}" if picked == "auto" else picked


def prepare(cfg, target, weights: dict | None = None) -> float | None:
    """Give ``target`` the compiled path when this run compiles, and every draft language model among the
    drafter ``weights`` (SpS's draft) the path covers, and every draft head (``compiled_heads``); compile them
    now (untimed) and return the seconds it took; None when the run stays eager. At ``batch_size`` B > 1: the
    target with its B-row graphs and the EAGLE heads for B rows (a draft model's buffer holds one row)."""
    if not decide(cfg):
        return None
    from eagle2.core.compiled import attach, supports

    rows = int(cfg.get("batch_size") or 1)
    if rows > 1:
        from eagle2.core.compiled_batch import StaticBatchKV

        decoder = attach(target)
        return (decoder.warm_up() + StaticBatchKV(decoder, rows).warm_up()
                + sum(part.warm_up() for part in compiled_heads(weights or {}, rows)))
    drafts = [w for w in (weights or {}).values() if hasattr(w, "lm_head") and hasattr(w, "base_model")
              and supports(w) is None]
    return sum(part.warm_up() for part in [*(attach(model) for model in (target, *drafts)),
                                           *compiled_heads(weights or {})])


def compiled_heads(weights: dict, rows: int = 1) -> list:
    """The compiled path of every draft head among ``weights``: an EAGLE-1/2 or EAGLE-3 head gets its static
    forward (``eagle2.heads.static_head``; ``rows`` > 1: over B-row buffers, ``eagle2.heads.static_head_batch``),
    Medusa or Hydra heads their compiled blocks (``eagle2.heads.compiled_stack``; batch 1 only); each returned
    part compiles on ``warm_up()``."""
    from eagle2.heads.compiled_stack import attach_stack
    from eagle2.heads.eagle3_head import Eagle3Head
    from eagle2.heads.eagle_head import EagleHead
    from eagle2.heads.medusa_heads import HeadStack
    from eagle2.heads.static_head import attach_head

    eagle, stacks = (EagleHead, Eagle3Head), (HeadStack,) if rows == 1 else ()
    # (exact types: a head that drafts otherwise, P-EAGLE's one-forward head, stays eager until it has its own path)
    return [attach_head(w, rows=rows) if type(w) in eagle else attach_stack(w)
            for w in weights.values() if type(w) in eagle or isinstance(w, stacks)]
