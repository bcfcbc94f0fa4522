"""Measuring the round costs of one target + drafter on this machine (the profile that
``eagle2.drafters.budget`` turns into a per-round budget for ``method=eagle2 method.total_tokens=auto``, or
REST's ``method.num_draft=auto``).

The harness measures it (``auto_budget_profile``, called by ``eagle2.bench.methods.build_drafter``) and hands
it to the drafter as data (``weights["cost_profile"]``): drafters never time target forwards themselves.

``T_verify(q)`` is one target forward over ``q`` tree tokens (root included) plus its LM head, and
``T_draft`` one drafting round at each depth up to the configured one. Both are measured once per
(target, head, drafting settings, device, dtype, threads, kernels) on a context of ``context`` tokens and
cached as JSON (``method.profile_dir``, default ``~/.cache/eagle2/profiles``);
``method.reprofile=true`` measures again. For batched decoding (``rows`` = B > 1, ``eagle2.core.batch_engine``)
``T_verify(q)`` is ``T_B(q)``: one forward over B rows of ``q`` tree tokens each, after B contexts, and the
LM head over all B * q of them; each B is its own profile.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from dataclasses import asdict
from pathlib import Path

import torch

from eagle2.bench.profile_checks import despike, measured_until_sound, probe_t1, stale_reason
from eagle2.core.cache import crop, forward_target, new_cache
from eagle2.core.clock import device_clock
from eagle2.core.features import LayerTap
from eagle2.core.kernels import kernels_in_use
from eagle2.drafters.budget import CostProfile
from eagle2.drafters.eagle_common import drafting_settings

DEFAULT_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eagle2" / "profiles"
_loaded: dict[str, "CostProfile"] = {}  # profiles in use by this process (measured once per process)


def monotone(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence (least squares, pool-adjacent-violators): a forward over more
    tokens never costs less (a single spike it pools into all its right-hand neighbours: ``despike`` first)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(int(n))]


def verify_curve(raw: list[float]) -> list[float]:
    """The profile's ``T_verify(q)`` from raw timings: spikes removed, then made non-decreasing."""
    return monotone(despike(raw))


def median_time(fn, reps: int, device="cpu") -> float:
    """Median seconds of ``fn()`` over ``reps`` calls after one untimed warm-up call (the clock waits for
    ``device``'s queued work)."""
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = device_clock(device)
        fn()
        times.append(device_clock(device) - t0)
    return statistics.median(times)


SETTLED_Q = 8  # the smallest trees, where the round policy weighs T(1) against T(q): measured interleaved
SWEEPS_PER_REP = 3  # interleaved sweeps over the smallest trees per repetition asked for
CATCH_UP_PAIRS = 32  # pending positions a row feeds in the catch-up the profile times


def interleaved(timed, keys: list, sweeps: int) -> dict:
    """Each key's median of ``sweeps`` single timings ``timed(key)``, taken in sweeps over all keys in alternating
    order: a change of a shared machine's speed during the measurement falls on every key alike, so their ratios
    (T(q) against T(1), which the round policy weighs) stay true where a pass per key would carry it into one
    (a B=8 profile once stored T(1) 50 ms against the 35 ms of the run's own plain rounds, T(4) true)."""
    times: dict = {key: [] for key in keys}
    for sweep in range(sweeps):
        for key in keys if sweep % 2 == 0 else keys[::-1]:
            times[key].append(timed(key))
    return {key: statistics.median(values) for key, values in times.items()}


@torch.no_grad()
def measure_verify(target, *, context: int, max_q: int, reps: int, timer=None, rows: int = 1) -> list[float]:
    """Median seconds of a target forward over ``rows`` chains of q tree tokens, each after ``context`` tokens; up
    to ``SETTLED_Q`` tokens interleaved (``interleaved``: ``SWEEPS_PER_REP`` x ``reps`` sweeps of one timing each),
    the larger trees one after another. ``timer(fn, reps, device, q)`` replaces the wall-clock median (e.g. GPU time
    by CUDA events)."""
    from eagle2.core.tree import DraftTree

    device = target.device
    gen = torch.Generator().manual_seed(0)
    vocab = target.config.vocab_size
    cache = new_cache(target, rows=rows)
    forward_target(target, torch.randint(vocab, (rows, context), generator=gen).to(device), cache)

    def timed(q: int, reps: int) -> float:
        tree = DraftTree(torch.randint(vocab, (q,), generator=gen), torch.arange(-1, q - 1),
                         confidence=torch.ones(q))
        # the inputs are on the device before the clock starts: a copy from the host inside the timed section
        # would sync the device, and a GPU clock would time the host
        tokens, mask, positions = tree.verify_inputs(context, target.dtype, device)
        tokens, positions = tokens.expand(rows, q), positions.expand(rows, -1)  # (B, q)
        mask = None if mask is None else mask.expand(rows, -1, -1, -1)  # (B, 1, q, context + q)

        def verify(tokens=tokens, mask=mask, positions=positions):
            hidden = forward_target(target, tokens, cache, attention_mask=mask, position_ids=positions)
            target.lm_head(hidden.reshape(-1, hidden.shape[-1]))
            crop(cache, context)

        return timer(verify, reps, device, q) if timer else median_time(verify, reps, device)

    small = list(range(1, min(SETTLED_Q, max_q) + 1))
    settled = interleaved(lambda q: timed(q, 1), small, SWEEPS_PER_REP * reps)
    return [settled[q] if q in settled else timed(q, reps) for q in range(1, max_q + 1)]


def profile_prompt(target, head, context: int):
    """One random prompt of ``context`` tokens and its features (the tapped layers' for an EAGLE-3 head): what the
    profile's drafters start on."""
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(target.config.vocab_size, (context,), generator=gen).tolist()
    layers = getattr(head, "feature_layers", None)  # an EAGLE-3 head reads tapped layers
    with LayerTap(target, layers or ()) as tap:
        hidden = forward_target(target, torch.tensor([prompt], device=target.device), new_cache(target))
        hidden = (tap.read() if layers else hidden)[0]
    return prompt, hidden


def started_drafters(make_drafter, depth: int, rows: int, prompt: list[int], hidden) -> list:
    """``rows`` drafters (``make_drafter(depth)``) started on ``prompt`` and its features."""
    drafters = [make_drafter(depth) for _ in range(rows)]
    for drafter in drafters:
        drafter.start(prompt, prompt[-1], hidden)
    return drafters


def timed_round(drafters, prompt, hidden, pairs: int):
    """One drafting round of ``drafters`` (together when more than one), then each hears ``pairs`` new positions
    (as after a round that accepted nothing, ``pairs`` = 1, or after plain rounds): the next round feeds them."""
    def round_():
        if len(drafters) == 1:
            drafters[0].propose(prompt[-1], room=1 << 30)
        else:
            type(drafters[0]).propose_batch(drafters, [prompt[-1]] * len(drafters), [1 << 30] * len(drafters))
        for drafter in drafters:
            drafter.observe(prompt[-pairs:], hidden[-pairs:])
    return round_


@torch.no_grad()
def measure_draft(target, head, make_drafter, *, depth: int, context: int, reps: int, rows: int = 1) -> list[float]:
    """Median seconds of one drafting round at depths 1..``depth``; ``make_drafter(d)`` builds the
    drafter (the EAGLE-2 drafter of ``head`` at depth ``d``). ``rows`` > 1: ``rows`` drafters drafting
    together, one ``propose_batch`` (``eagle2.drafters.head_group``), as batched decoding's rounds do."""
    prompt, hidden = profile_prompt(target, head, context)  # one target forward for every depth
    out = []
    for d in range(1, depth + 1):
        drafters = started_drafters(make_drafter, d, rows, prompt, hidden)
        out.append(median_time(timed_round(drafters, prompt, hidden, 1), reps, target.device))
    return out


@torch.no_grad()
def measure_catch_up(target, head, make_drafter, *, context: int, reps: int, rows: int = 1,
                     one_pair_s: float) -> float:
    """Seconds per further pending position a row: a depth-1 drafting round after each row heard
    ``CATCH_UP_PAIRS`` positions (at most ``context``), less ``one_pair_s`` (the round after one), over the further
    ones."""
    pairs = max(min(CATCH_UP_PAIRS, context), 2)
    prompt, hidden = profile_prompt(target, head, context)
    drafters = started_drafters(make_drafter, 1, rows, prompt, hidden)
    timed_round(drafters, prompt, hidden, pairs)()  # the first round still feeds the prompt's last pair
    seconds = median_time(timed_round(drafters, prompt, hidden, pairs), reps, target.device)
    return max(seconds - one_pair_s, 0.0) / (pairs - 1)


def profile_key(target, head, drafting: dict, depth: int, top_k: int, context: int, max_q: int, rows: int = 1,
                draft_rows: int = 1) -> str:
    vocab, kernels = drafting.get("vocab"), kernels_in_use(target)
    head_facts = head.config.to_dict() if head is not None else {"drafter": drafting.get("method")}  # head-less: REST
    facts = {"target": target.config.to_dict(), "head": head_facts, "depth": depth, "top_k": top_k,
             "draft_vocab": None if vocab is None else len(vocab), "lm_head_dtype": str(drafting.get("lm_head_dtype")),
             "device": str(target.device), "dtype": str(target.dtype), "threads": torch.get_num_threads(),
             **({} if kernels == "stock" else {"kernels": kernels}),
             "context": context, "max_q": max_q, "torch": torch.__version__,
             "curve": "despiked-centred",  # older profiles: a load-flattened curve, or T(1) raised to ~T(2)
             "catch_up": CATCH_UP_PAIRS,  # older profiles: no catch-up measured
             "settled_q": SETTLED_Q,  # older profiles: the small trees measured in one pass
             "interleaved": SWEEPS_PER_REP,  # older profiles: the small trees in three passes, each q in turn
             **({"rows": rows} if rows > 1 else {}),  # batch 1 keeps every existing key
             **({"draft_rows": draft_rows} if draft_rows > 1 else {})}
    for noisy in ("_name_or_path", "transformers_version", "torch_dtype", "dtype", "architectures"):
        facts["target"].pop(noisy, None)
        facts["head"].pop(noisy, None)
    return hashlib.sha1(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_profile(path: Path) -> CostProfile | None:
    """The profile cached at ``path``; None when there is none or it cannot be read (a torn write, another
    version's format): then it is measured again and rewritten, with a warning."""
    if not path.exists():
        return None
    try:
        return CostProfile(**json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError; unknown/missing fields: TypeError
        print(f"[eagle2] the cached cost profile {path} cannot be read ({type(exc).__name__}: {exc}); "
              "measuring it again", flush=True)
        return None


def get_profile(target, head, drafting: dict, make_drafter, *, depth: int, top_k: int,
                profile_dir: str | Path | None = None, remeasure: bool = False, context: int = 256, max_q: int = 64,
                reps: int = 5, rows: int = 1, draft_rows: int = 1) -> CostProfile:
    """The cached profile for this target/head/settings on this machine, measured if absent;
    ``make_drafter(d)`` builds the drafter whose rounds are timed (see ``measure_draft``); ``rows``: the
    batch size whose verify cost ``T_B(q)`` it holds; ``draft_rows``: the rows that draft together."""
    key = profile_key(target, head, drafting, depth, top_k, context, max_q, rows, draft_rows)
    path = Path(profile_dir or DEFAULT_DIR) / f"{key}.json"
    if key in _loaded:  # reprofile means once per process, not once per drafter
        return _loaded[key]
    context = min(context, int(getattr(target.config, "max_position_embeddings", context)) - max_q)
    profile = None if remeasure else read_profile(path)
    probe = probe_t1(measure_verify, target, context=profile.context if profile else context, rows=rows)
    reason = stale_reason(profile, probe) if profile is not None else None  # eagle2.bench.profile_checks
    if reason:
        print(f"[eagle2] the cached cost profile {path} is measured again: {reason}", flush=True)
        profile = None
    if profile is None:
        print(f"[eagle2] measuring the cost profile (verify {rows} x q=1..{max_q}, draft depth 1..{depth}) -> {path}",
              flush=True)

        def measure() -> CostProfile:
            raw = measure_verify(target, context=context, max_q=max_q, reps=reps, rows=rows)
            draft = measure_draft(target, head, make_drafter, depth=depth, context=context, reps=reps,
                                  rows=draft_rows)
            catch_up = measure_catch_up(target, head, make_drafter, context=context, reps=reps, rows=draft_rows,
                                        one_pair_s=draft[0])
            return CostProfile(verify_curve(raw), draft, context, {
                "key": key, "device": str(target.device), "dtype": str(target.dtype),
                "threads": torch.get_num_threads(), "verify_raw_s": raw, "probe_t1_s": probe[0], "noise": probe[1]},
                rows, draft_rows, catch_up)

        profile, problems = measured_until_sound(measure)
        if problems:
            profile.meta["cached"] = False  # this process only: a later run measures again
        else:
            write_profile(path, profile)
    _loaded[key] = profile
    return profile


def write_profile(path: Path, profile: CostProfile) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(profile), indent=1))
    os.replace(tmp, path)


BUDGET_KEYS = {"total_tokens": "max_total_tokens", "num_draft": "max_num_draft"}  # budget key -> its cap's key


def auto_budget_key(method_cfg) -> str | None:
    """The method's budget key set to ``auto`` (EAGLE-2's ``total_tokens``, REST's ``num_draft``), else None."""
    return next((key for key in BUDGET_KEYS if str(method_cfg.get(key)) == "auto"), None)


def auto_budget_profile(method_cfg, target, head, build_at) -> CostProfile:
    """The profile a method with an ``auto`` budget prices its rounds with, for its config on this machine.
    ``build_at(cfg)`` builds the method's drafter for a config; the profile times its rounds at depths
    1..``depth`` with one node kept (no budget, no lookup branch, a fixed depth; a drafter without a head, REST,
    at one depth: its rounds are lookups). ``verify_rows`` (set by the batched runner): the batch size whose
    verify cost ``T_B(q)`` it holds; ``draft_rows`` (set with it when the rows draft together): the rows one
    drafting round of the profile covers."""
    from omegaconf import OmegaConf

    base, key = OmegaConf.to_container(method_cfg, resolve=True), auto_budget_key(method_cfg)
    has_head = key == "total_tokens"

    def make_drafter(d: int):  # the drafter whose rounds the profile times
        return build_at(OmegaConf.create({**base, "depth": d, key: 1, "lookup_branch": False,
                                          "adaptive_depth": False}))

    drafting = drafting_settings(method_cfg, head) if has_head else {"method": base["name"]}
    return get_profile(target, head if has_head else None, drafting, make_drafter,
                       depth=int(method_cfg.depth) if has_head else 1,
                       top_k=int(method_cfg.top_k) if has_head else 0, profile_dir=method_cfg.get("profile_dir"),
                       remeasure=bool(method_cfg.get("reprofile", False)),
                       max_q=int(method_cfg.get(BUDGET_KEYS[key]) or 64) + 1,
                       rows=int(method_cfg.get("verify_rows") or 1),
                       draft_rows=int(method_cfg.get("draft_rows") or 1) if has_head else 1)
