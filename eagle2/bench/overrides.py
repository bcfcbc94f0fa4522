"""Command-line overrides checked before Hydra runs the entry point, each problem one line.

Hydra answers a key no config has (``method.bogus=2``, ``head.resume_dirr=x``), an option a group lacks
(``method=nosuch``) and an override it cannot parse with several lines ending in its ``HYDRA_FULL_ERROR`` hint.
``override_problem`` composes the config with the command line's overrides (a sweep's ``a,b`` values left to the
sweep) and says what is wrong in one line: the key and how to add it, the nearest known key
(``eagle2.bench.known_keys``, for ``run.py``'s config), the options a group has.
"""

from __future__ import annotations

from pathlib import Path

from eagle2.bench.known_keys import CONF_DIR, nearest_keys


def _overrides(argv: list[str]) -> list[str]:
    """The plain (not sweep) overrides of a command line; flags and their values left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    candidates = [a for a in argv if "=" in a and not a.startswith("-")]
    parsed = OverridesParser.create().parse_overrides(candidates)
    return [text for text, o in zip(candidates, parsed) if not o.is_sweep_override()]


def _one_line(exc: Exception, config_name: str) -> str:
    from hydra.errors import MissingConfigException

    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if isinstance(exc, MissingConfigException):
        options = [line for line in lines[2:] if not any(c in line for c in "=:/ ")]
        return f"{lines[0].split(': ', 1)[-1]}; the options are {', '.join(options)}"
    if lines[0].startswith("Could not override '"):
        key = lines[0].split("'")[1]
        near = nearest_keys(key) if config_name == "config" else []
        hint = f"did you mean {' or '.join(near)}? " if near else ""
        value = lines[-1].split("+", 1)[-1] if len(lines) > 1 else key
        return f"unknown key {key}: the config as composed has no such key; {hint}to add it anyway write +{value}"
    from hydra.errors import OverrideParseException

    what = "cannot parse an override: " if isinstance(exc, OverrideParseException) else ""
    return what + "; ".join(lines[:1] + [line for line in lines[1:] if not line.startswith("See https://")])


def override_problem(config_name: str, argv: list[str], conf_dir: str | Path = CONF_DIR) -> str | None:
    """One line saying why Hydra would refuse ``argv``'s overrides of ``config_name``; None when it composes."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    try:
        overrides = _overrides(argv)
        with initialize_config_dir(str(Path(conf_dir).resolve()), version_base="1.3"):
            compose(config_name, overrides=overrides)
    except HydraException as exc:
        return _one_line(exc, config_name)
    return None


def refuse_bad_overrides(config_name: str, argv: list[str]) -> None:
    """Exit with one line when Hydra would refuse the command line (entry points call it before ``main``)."""
    problem = override_problem(config_name, argv)
    if problem:
        raise SystemExit(f"[eagle2] {problem}")
