"""``conf/`` as the one registry: what exists is what has a YAML there, and each YAML says how it is
shown. Reads YAML only (no torch, no drafter): the results store, the prompts, the harness and the
analysis all read it.

- methods, ``conf/method/<name>.yaml``: ``drafter`` (a ``module.function`` path building the drafter),
  ``weights`` (model-config keys of the drafter weights it needs, each a drafter family of
  ``eagle2.heads.family``), ``display`` (e.g. "EAGLE-2") and ``order`` (an int: where tables list it). A
  method config made in code without them (tests build ``{"name": "sps", "k": 2}``) takes them from its YAML.
- models, ``conf/model/<name>.yaml``: ``architecture``, the target's hub ``config.json`` facts (a GPU model's
  shapes, for random stand-ins: ``eagle2.heads.shapes``); ``model_architecture``, ``gpu_models``.
- benchmarks, ``conf/dataset/<name>.yaml``: ``title`` (the paper's column title, e.g. "MT-bench", which
  also heads the published table's column), ``display`` and ``order``.

None of these keys changes what is decoded: the store keeps them out of the config hash (``SPEC_KEYS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
METHOD_DIR = CONF_DIR / "method"
DATASET_DIR = CONF_DIR / "dataset"
MODEL_DIR = CONF_DIR / "model"
SPEC_KEYS = ("drafter", "weights", "display", "order")  # how a method is built and shown: not hashed


@dataclass(frozen=True)
class MethodSpec:
    name: str
    drafter: str  # "package.module.function" building the drafter
    weights: tuple[str, ...]  # model-config keys of the drafter weights it needs


@dataclass(frozen=True)
class Entry:
    """How a registered method or benchmark is shown: its display name, its place in tables, its title."""
    name: str
    display: str
    order: int
    title: str


def known_methods() -> list[str]:
    return sorted(p.stem for p in METHOD_DIR.glob("*.yaml"))


def known_benchmarks() -> list[str]:
    """The benchmarks in table order (each ``conf/dataset`` YAML's ``order``)."""
    return sorted((p.stem for p in DATASET_DIR.glob("*.yaml")), key=lambda name: (benchmark(name).order, name))


@lru_cache(maxsize=None)
def _yaml(folder: Path, name: str):
    from omegaconf import OmegaConf  # here, not at the top: the GPU check reads questions without omegaconf

    path = folder / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in folder.glob("*.yaml"))
        raise ValueError(f"unknown {folder.name} {name!r}; choose one of {', '.join(known)}")
    return OmegaConf.load(path)


@lru_cache(maxsize=None)
def model_architecture(name: str) -> dict | None:
    """The ``architecture`` a model config states (its target's ``config.json`` facts), None where it states none;
    plain YAML (the GPU check reads it without omegaconf)."""
    import yaml

    return (yaml.safe_load((MODEL_DIR / f"{name}.yaml").read_text()) or {}).get("architecture")


def gpu_models() -> list[str]:
    """The model configs that state their architecture (every GPU model; not the embedded CPU model)."""
    return sorted(p.stem for p in MODEL_DIR.glob("*.yaml") if not p.stem.startswith("_") and model_architecture(p.stem))


def _entry(folder: Path, name: str) -> Entry:
    cfg = _yaml(folder, name)
    display = str(cfg.get("display") or name)
    return Entry(name, display, int(cfg.get("order", 1000)), str(cfg.get("title") or display))


def method(name: str) -> Entry:
    return _entry(METHOD_DIR, name)


def benchmark(name: str) -> Entry:
    return _entry(DATASET_DIR, name)


def method_rank(name: str) -> tuple[int, str]:
    """Sort key of a method name; an unregistered one goes last (a results folder may hold retired methods)."""
    return (method(name).order if (METHOD_DIR / f"{name}.yaml").is_file() else 10**6, name)


def display_name(name: str) -> str:
    """A method's display name; ``eagle2+lookup`` -> "EAGLE-2 + lookup"; an unregistered part stays as is."""
    return " + ".join(method(p).display if (METHOD_DIR / f"{p}.yaml").is_file() else p for p in name.split("+"))


def method_spec(method_cfg) -> MethodSpec:
    """The spec of a method config: its own ``drafter``/``weights`` keys, else its YAML's."""
    name = method_cfg.get("name")
    drafter, weights = (method_cfg.get("drafter"), method_cfg.get("weights"))
    if drafter is None or weights is None:
        cfg = _yaml(METHOD_DIR, str(name))
        drafter = drafter or str(cfg.drafter)
        weights = tuple(cfg.get("weights") or ()) if weights is None else weights
    return MethodSpec(str(name), str(drafter), tuple(weights))
