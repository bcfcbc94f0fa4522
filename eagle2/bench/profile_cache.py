"""The cached cost profiles of this machine, shown or cleared:

    python -m eagle2.bench.profile_cache           # one line each: settings, T(1), T(max q), draft, noise, problems
    python -m eagle2.bench.profile_cache --clear   # delete them all (the next auto-budget run measures again)
    python -m eagle2.bench.profile_cache --dir D   # another folder than ~/.cache/eagle2/profiles (method.profile_dir)

The checks are ``eagle2.bench.profile_checks``'s; a profile that cannot be read is listed as such.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eagle2.bench.cost_profile import DEFAULT_DIR
from eagle2.bench.profile_checks import profile_problems
from eagle2.drafters.budget import CostProfile


def describe(path: Path) -> str:
    """One line about the profile cached at ``path``."""
    try:
        profile = CostProfile(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        return f"{path.stem}: unreadable (measured again at its next use)"
    meta, ms = profile.meta or {}, [f"{t * 1e3:.1f}" for t in profile.draft_s]
    noise = meta.get("noise")
    problems = profile_problems(profile)
    return (f"{path.stem}: {meta.get('device')} {meta.get('dtype')} {meta.get('threads')} threads, rows "
            f"{profile.rows}, context {profile.context}: T(1) {profile.verify_s[0] * 1e3:.1f} ms, "
            f"T({len(profile.verify_s)}) {profile.verify_s[-1] * 1e3:.1f} ms, draft by depth {'/'.join(ms)} ms, "
            + (f"noise {noise:.0%}" if noise is not None else "noise unrecorded (checked again at its next use)")
            + (f"; REFUSED: {'; '.join(problems)}" if problems else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="the profiles folder (method.profile_dir)")
    parser.add_argument("--clear", action="store_true", help="delete every cached profile")
    args = parser.parse_args(argv)
    paths = sorted(args.dir.glob("*.json"))
    if args.clear:
        for path in paths:
            path.unlink()
        print(f"deleted {len(paths)} cost profile(s) from {args.dir}")
        return 0
    print(f"{len(paths)} cost profile(s) in {args.dir}")
    for path in paths:
        print(describe(path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
