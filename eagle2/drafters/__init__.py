"""Drafters: each turns the committed context into a DraftTree (the interface: ``eagle2.drafters.base``).

``build_drafter`` picks one through the method registry (``eagle2.methods``: each method's YAML names
its drafter's ``build`` function and the weights it needs); the engine never knows which one it runs.
"""

from __future__ import annotations

from eagle2.methods import drafter_factory, method_spec


def build_drafter(method_cfg, target, params, generator, *, head=None, draft_model=None, weights: dict | None = None):
    """The drafter of ``method_cfg``. Weights come as ``weights`` (model-config key -> loaded weights,
    as the runner loads them) or, for the two kinds that exist, as ``head=`` / ``draft_model=``."""
    spec = method_spec(method_cfg)
    given = {"head": head, "sps_draft": draft_model, **(weights or {})}
    missing = [key for key in spec.weights if given.get(key) is None]
    if missing:
        raise ValueError(f"method={spec.name} needs {' and '.join(f'model.{k}' for k in missing)}")
    return drafter_factory(spec)(method_cfg, target, params, generator, {k: given[k] for k in spec.weights})
