"""The method registry's harness half: build the drafter a method config names (its spec, which drafter
and which weights, is read by ``eagle2.registry``), handing it its weights and, for an auto budget
(``total_tokens=auto``, REST's ``num_draft=auto``), the cost profile the harness measures
(``eagle2.bench.cost_profile``); under ``method.policy=pays`` the drafter comes wrapped in the per-round
choice to draft or not (``eagle2.bench.policy_profile``)."""

from __future__ import annotations

import importlib

from eagle2.registry import MethodSpec, method_spec


def drafter_factory(spec: MethodSpec):
    module, _, function = spec.drafter.rpartition(".")
    return getattr(importlib.import_module(module), function)


def build_drafter(method_cfg, target, params, generator, *, weights: dict | None = None, run_state: dict | None = None,
                  **by_key):
    """The drafter of ``method_cfg``. Weights come as ``weights`` (model-config key -> loaded weights, as the
    runner loads them) or as keywords named by their drafter family's model-config key (``head=``, ``sps_draft=``,
    ``eagle2.heads.family``); ``weights`` wins where both name a key.
    ``run_state``: one dict per run, handed to every drafter of the run as ``weights["run_state"]``, for what
    a method learns across requests (SuffixDecoding's global tree); None: each drafter starts afresh."""
    from eagle2.heads.family import families

    if unknown := sorted(set(by_key) - set(families())):
        raise TypeError(f"build_drafter: {', '.join(unknown)} is no drafter family's key ({', '.join(families())})")
    spec = method_spec(method_cfg)
    given = {**by_key, **(weights or {})}
    missing = [key for key in spec.weights if given.get(key) is None]
    if missing:
        raise ValueError(f"method={spec.name} needs {' and '.join(f'model.{k}' for k in missing)}")
    factory, chosen = drafter_factory(spec), {k: given[k] for k in spec.weights}
    from eagle2.bench.cost_profile import auto_budget_key, auto_budget_profile

    if auto_budget_key(method_cfg):
        chosen["cost_profile"] = auto_budget_profile(method_cfg, target, chosen[spec.weights[0]],
                                                     lambda cfg: factory(cfg, target, params, None, chosen))
    if run_state is not None:
        chosen["run_state"] = run_state
    from eagle2.bench.policy_profile import with_policy

    drafter = factory(method_cfg, target, params, generator, chosen)
    return with_policy(drafter, method_cfg, target, {**chosen, "policy_profile": given.get("policy_profile")},
                       lambda cfg: factory(cfg, target, params, None, chosen))
