"""EAGLE-3: the EAGLE-2 dynamic tree (``eagle2.drafters.eagle2_dynamic``, unchanged: same budget, same
per-node records) drafted by an EAGLE-3 head (``eagle2.heads.eagle3_head``), which reads the fused inputs of
three target layers (captured by the engine) and drafts over its own reduced vocabulary."""

from __future__ import annotations

from eagle2.drafters import eagle2_dynamic

CHECKS = {key: check for key, check in eagle2_dynamic.CHECKS.items() if key != "lookup_branch"}  # no lookup branch


def build(method_cfg, target, params, generator, weights: dict):
    return eagle2_dynamic.build(method_cfg, target, params, generator,
                                {"head": weights["eagle3_head"], "cost_profile": weights.get("cost_profile")})
