"""Unknown config keys refused in one line, with the nearest known key.

Hydra refuses ``model.eagle_head=X`` but lets ``+model.eagle_head=X`` through; the run would then decode
with the shipped head under the default config's hash. The keys a run may carry are what the config
groups themselves compose to: ``conf/config.yaml`` with every option of every group (model, method,
dataset, logger) and every experiment preset. No list is kept by hand, so a key added to any YAML is known at
once. Composing them all takes seconds, so the result is cached on disk (``~/.cache/eagle2/known_keys/``), keyed
by the text of every YAML under the config folder, the drafter families' keys (``eagle2.bench.family_keys``), Hydra's
version and this module's own source: any edit to either composes them again.

Below a key whose composed value is not a mapping (a list, a scalar, null) or is an empty mapping, any
structure is accepted: such values are the user's data (``model.max_memory={0: 70GiB}``).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from eagle2.prompts.questions import PROJECT_ROOT

CONF_DIR = PROJECT_ROOT / "conf"
GROUPS = ("model", "method", "dataset", "logger", "experiment")  # the groups a run's config composes from


def _merge(known: dict, tree: dict) -> None:
    """Add the key structure of ``tree`` to ``known`` (a mapping wins over a leaf at the same key)."""
    for key, value in tree.items():
        if isinstance(value, dict):
            if not isinstance(known.get(key), dict):
                known[key] = {}
            _merge(known[key], value)
        else:
            known.setdefault(key, None)


CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eagle2" / "known_keys"


def _conf_fingerprint(conf_dir: str) -> str:
    """A hash of every YAML file's path and text under ``conf_dir``, of the families' keys (every model's keys too),
    of Hydra's version and of this module's source (the code that builds the key list: a change to it is a new list)."""
    import hydra

    from eagle2.heads.family import families

    keyed_by = " ".join([hydra.__version__, *sorted(families())])
    digest = hashlib.sha1(keyed_by.encode() + b"\0" + Path(__file__).read_bytes())
    for path in sorted(Path(conf_dir).rglob("*.yaml")):
        digest.update(str(path.relative_to(conf_dir)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@lru_cache(maxsize=4)
def known_tree(conf_dir: str = str(CONF_DIR), cache_dir: str | None = None) -> dict:
    """The union of the key structures of every composition of ``conf_dir``'s primary config with one
    option of one group (options starting with ``_`` are bases the others include); read from the disk
    cache when the config folder is unchanged (an unreadable cache file is composed again and rewritten)."""
    path = Path(cache_dir or CACHE_DIR) / f"{_conf_fingerprint(conf_dir)}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    known = _compose_known(conf_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known))
        os.replace(tmp, path)
    except OSError:  # a read-only home: compose each time, as before
        pass
    return known


def _compose_known(conf_dir: str) -> dict:
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.types import RunMode

    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(conf_dir))
    overrides = [[]] + [[f"{group}={option}"] for group in GROUPS for option in loader.get_group_options(group)
                        if not option.startswith("_")]
    known: dict = {}
    for override in overrides:
        cfg = loader.load_configuration(config_name="config", overrides=override, run_mode=RunMode.RUN)
        tree = OmegaConf.to_container(cfg, resolve=False)
        tree.pop("hydra", None)
        _merge(known, tree)
    return known


def _paths(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        out.append(prefix + str(key))
        if isinstance(value, dict):
            out.extend(_paths(value, f"{prefix}{key}."))
    return out


def unknown_keys(cfg: DictConfig | dict, known: dict | None = None, prefix: str = "") -> list[str]:
    """Dotted paths of the keys of ``cfg`` that no composition of the config groups has."""
    tree = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else cfg
    known = known_tree() if known is None else known
    out = []
    for key, value in tree.items():
        if key == "hydra":
            continue
        if key not in known:
            out.append(prefix + str(key))
        elif isinstance(value, dict) and isinstance(known[key], dict) and known[key]:
            out.extend(unknown_keys(value, known[key], f"{prefix}{key}."))
    return out


def nearest_keys(path: str, known: dict | None = None, n: int = 2) -> list[str]:
    """The known dotted keys closest to ``path``, from its own section first: those closest in spelling,
    then those whose last part is a word of its last part (``model.eagle_head``: ``model.head``)."""
    candidates = _paths(known_tree() if known is None else known)
    section, _, last = path.rpartition(".")
    same = [c for c in candidates if c.rpartition(".")[0] == section]
    for pool in (same, candidates):
        close = difflib.get_close_matches(path, pool, n=n, cutoff=0.6)
        words = [c for c in pool if c not in close and c.rpartition(".")[2] in last.split("_")]
        if close or words:
            return close + words[:1]
    return []


def unknown_key_message(cfg: DictConfig) -> str | None:
    """One line naming the first unknown key and the nearest known one; None when every key is known."""
    unknown = unknown_keys(cfg)
    if not unknown:
        return None
    near = nearest_keys(unknown[0])
    hint = f"; did you mean {' or '.join(near)}?" if near else ""
    more = f" (and {len(unknown) - 1} more: {', '.join(unknown[1:4])})" if len(unknown) > 1 else ""
    return (f"unknown key {unknown[0]}{more}: no config under {Path(CONF_DIR).name}/ has it, so it would "
            f"change nothing{hint}")
