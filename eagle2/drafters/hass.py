"""HASS: the EAGLE-2 dynamic tree (``eagle2.drafters.eagle2_dynamic``, unchanged) drafted by a HASS-trained
EAGLE-1 head (``model.hass_head``; the training is ``eagle2.training.objectives.hass``)."""

from __future__ import annotations

from eagle2.drafters import eagle2_dynamic

CHECKS = eagle2_dynamic.CHECKS


def build(method_cfg, target, params, generator, weights: dict):
    return eagle2_dynamic.build(method_cfg, target, params, generator,
                                {"head": weights["hass_head"], "cost_profile": weights.get("cost_profile")})
