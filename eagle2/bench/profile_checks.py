"""Cost profiles checked when written and before use, so that one measured on a busy machine cannot poison
later runs (``eagle2.bench.cost_profile`` caches them per config and every later run reuses them).

- **noise**: a quick ``T(1)`` probe, ``PROBE_REPEATS`` separate measurements of a one-token verify after the
  profile's context; their spread (max - min over the median) is the profile's measured noise, stored with
  it (``meta.noise``, ``meta.probe_t1_s``) beside its raw timings (``meta.verify_raw_s``).
- **shape** (``profile_problems``): ``T(q)`` before pooling (the despiked raw timings) never falls below an
  earlier value by more than the noise allows, and the drafting cost never falls with depth by more than
  that: a curve that a burst of load distorted fails this. The allowance is ``max(SHAPE_TOLERANCE, 3 x
  noise)`` relative.
- **before use**: a cached profile is probed again; when the probe's ``T(1)`` differs from the stored one by
  more than ``max(PROBE_TOLERANCE, 3 x noise)`` relative, or the stored profile fails the shape check, it is
  measured again (a profile written before these checks has no noise recorded: the probe's own counts).

A measurement that fails the shape check is taken again (``MEASURE_ATTEMPTS`` in all); if every attempt
fails, the last is used for this process only, with a warning, and never cached. Each row of an auto-budget
run records the profile it was priced with (``cost_profile``: key, ``T(1)``, noise).
"""

from __future__ import annotations

import statistics

PROBE_REPEATS = 5
PROBE_TOLERANCE = 0.5  # a stored T(1) more than 50 % away from the probe's is measured again
SHAPE_TOLERANCE = 0.25  # T(q) may fall by 25 % (or 3 x the noise) before the curve is refused
MEASURE_ATTEMPTS = 3


def despike(values: list[float], window: int = 5) -> list[float]:
    """Each timing replaced by the median of the ``window`` timings centred on it (narrower near the ends, so
    that the window stays centred): one timing taken while another process held the core must not move the
    whole curve. ``monotone`` alone pools a spike into all its right-hand neighbours: a spike at q=2 once made
    T(2..25) flat, and the budget always the largest. Each end is the median of itself, its neighbour and the
    line through its two neighbours: a spike there is removed, and a rising curve keeps its true ends (a
    window clipped at the end raised T(1) to about T(2): at 8 rows, 29.0 -> 34.3 ms, and every node looked
    cheaper than it is)."""
    n = len(values)
    out = []
    for i in range(n):
        half = min(window // 2, i, n - 1 - i)
        out.append(statistics.median(values[i - half: i + half + 1]))
    if n >= 3:
        out[0] = statistics.median([values[0], out[1], 2 * out[1] - out[2]])
        out[-1] = statistics.median([values[-1], out[-2], 2 * out[-2] - out[-3]])
    return out


def probe_t1(measure_verify, target, *, context: int, rows: int) -> tuple[float, float]:
    """(median T(1) in seconds, relative spread) of ``PROBE_REPEATS`` separate one-token verify timings."""
    times = [measure_verify(target, context=context, max_q=1, reps=3, rows=rows)[0] for _ in range(PROBE_REPEATS)]
    median = statistics.median(times)
    return median, (max(times) - min(times)) / median if median > 0 else 0.0


def _allowance(noise: float, floor: float) -> float:
    return max(floor, 3.0 * noise)


def _falls(values: list[float], allowance: float) -> tuple[int, int] | None:
    """(i, j), i < j, where ``values[j]`` is below the running maximum ``values[i]`` by more than ``allowance``."""
    top = 0
    for j, v in enumerate(values):
        if values[top] > 0 and v < values[top] * (1 - allowance):
            return top, j
        if v > values[top]:
            top = j
    return None


def profile_problems(profile) -> list[str]:
    """What is wrong with ``profile``'s shape (module docstring); empty when nothing is."""
    meta = profile.meta or {}
    allowance = _allowance(float(meta.get("noise") or 0.0), SHAPE_TOLERANCE)
    problems = []
    curve = despike(list(meta.get("verify_raw_s") or profile.verify_s))
    fall = _falls(curve, allowance)
    if fall:
        i, j = fall
        problems.append(f"T(q) falls from {curve[i] * 1e3:.1f} ms at q={i + 1} to {curve[j] * 1e3:.1f} ms at "
                        f"q={j + 1}, beyond its noise")
    fall = _falls(list(profile.draft_s), allowance)
    if fall:
        i, j = fall
        problems.append(f"drafting costs {profile.draft_s[i] * 1e3:.1f} ms at depth {i + 1} but "
                        f"{profile.draft_s[j] * 1e3:.1f} ms at depth {j + 1}")
    return problems


def stale_reason(profile, probe: tuple[float, float]) -> str | None:
    """Why a cached ``profile`` must be measured again, given a fresh ``probe`` (T(1), noise); None: use it."""
    problems = profile_problems(profile)
    if problems:
        return problems[0]
    t1, noise = probe
    stored = profile.verify_s[0]
    tolerance = _allowance(max(noise, float((profile.meta or {}).get("noise") or 0.0)), PROBE_TOLERANCE)
    if stored > 0 and abs(t1 / stored - 1) > tolerance:
        return (f"T(1) measures {t1 * 1e3:.2f} ms now against {stored * 1e3:.2f} ms stored (beyond "
                f"{tolerance:.0%})")
    return None


def measured_until_sound(measure) -> tuple[object, list[str]]:
    """``measure()`` (a fresh profile) up to ``MEASURE_ATTEMPTS`` times until it passes the shape check;
    returns the profile and the last attempt's problems (empty: sound, it may be cached)."""
    for attempt in range(1, MEASURE_ATTEMPTS + 1):
        profile = measure()
        problems = profile_problems(profile)
        if not problems:
            return profile, []
        print(f"[eagle2] cost profile attempt {attempt}/{MEASURE_ATTEMPTS} refused: {'; '.join(problems)} (a busy "
              "machine?)", flush=True)
    print("[eagle2] using the last cost profile for this run only, not caching it: measure it again on a quiet "
          "machine (method.reprofile=true) or set method.total_tokens to a number", flush=True)
    return profile, problems


def stamp(profile) -> dict | None:
    """What a row records of the profile its budget was priced with (None: no auto budget)."""
    if profile is None:
        return None
    meta = profile.meta or {}
    return {"key": meta.get("key"), "t1_s": profile.verify_s[0], "noise": meta.get("noise"),
            "cached": bool(meta.get("cached", True))}
