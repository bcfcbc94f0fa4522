"""The project's OmegaConf resolvers, registered once wherever configs are composed.

- ``device_type``: ``cuda:0``, ``cuda:1`` -> ``cuda``; ``mps`` -> ``mps``; ``cpu`` -> ``cpu``; so that
  settings keyed by device (``conf/experiment/_scale.yaml``) work for any device index;
- ``first_set``: the first argument that is not null (a model's own protocol value, else the
  dataset's: ``max_new_tokens`` in ``conf/config.yaml``);
- ``first_items``: the first N items of a list (an experiment's extra run on the first 60 nodes of
  ``model.mc_sim_7b_63``: ``conf/experiment/equal_budgets.yaml``).

``register()`` is idempotent and needs only omegaconf; importing ``eagle2.bench`` calls it (without
omegaconf installed it does nothing: nothing then composes configs either).
"""

from __future__ import annotations


def device_type(device) -> str:
    """The device type of a device string: the part before any ``:index``."""
    text = str(device).strip()
    kind = text.split(":", 1)[0]
    if not kind or (":" in text and not text.split(":", 1)[1].isdigit()):
        raise ValueError(f"model.device={device!r} is not a device (cpu, cuda, cuda:N, mps)")
    return kind


def first_set(*values):
    """The first value that is not None (None when all are)."""
    return next((v for v in values if v is not None), None)


def first_items(items, count) -> list:
    """The first ``count`` items of a list (a list or an OmegaConf ListConfig), as plain Python values."""
    from omegaconf import ListConfig, OmegaConf

    plain = OmegaConf.to_container(items, resolve=True) if isinstance(items, ListConfig) else list(items)
    return plain[: int(count)]


def register() -> None:
    try:
        from omegaconf import OmegaConf
    except ImportError:
        return
    for name, fn in (("device_type", device_type), ("first_set", first_set), ("first_items", first_items)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
