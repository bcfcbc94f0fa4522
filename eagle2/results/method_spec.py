"""The one place that says, for each decoding method, which drafter builds its trees and which
drafter weights it needs: its own ``conf/method/<name>.yaml`` (keys ``drafter``, a ``module.function``
path, and ``weights``, model-config keys such as ``head`` or ``sps_draft``).

The harness's ``build_drafter`` (``eagle2.bench.methods``), the runner's weight loading and the config
hash all read it from here, so adding a method is one drafter module (with a ``build`` function) plus one
YAML. A method config made in code without those keys (tests build ``{"name": "sps", "k": 2}``) takes
them from the method's YAML. This module reads YAML only and imports no drafter: the results store
(which keeps the spec keys out of the config hash) reads it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from omegaconf import OmegaConf

METHOD_DIR = Path(__file__).resolve().parents[2] / "conf" / "method"
SPEC_KEYS = ("drafter", "weights")  # how a method is built, not what it computes: kept out of the config hash


@dataclass(frozen=True)
class MethodSpec:
    name: str
    drafter: str  # "package.module.function" building the drafter
    weights: tuple[str, ...]  # model-config keys of the drafter weights it needs


def known_methods() -> list[str]:
    return sorted(p.stem for p in METHOD_DIR.glob("*.yaml"))


@lru_cache(maxsize=None)
def _from_yaml(name: str) -> tuple[str, tuple[str, ...]]:
    path = METHOD_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(known_methods())}")
    cfg = OmegaConf.load(path)
    return str(cfg.drafter), tuple(cfg.get("weights") or ())


def method_spec(method_cfg) -> MethodSpec:
    """The spec of a method config: its own ``drafter``/``weights`` keys, else its YAML's."""
    name = method_cfg.get("name")
    drafter, weights = (method_cfg.get("drafter"), method_cfg.get("weights"))
    if drafter is None or weights is None:
        yaml_drafter, yaml_weights = _from_yaml(str(name))
        drafter = drafter or yaml_drafter
        weights = yaml_weights if weights is None else weights
    return MethodSpec(str(name), str(drafter), tuple(weights))

