"""The HASS head's weights (``model.hass_head``): an EAGLE-1 head in its published format
(``eagle2.heads.eagle_head``), trained by HASS's objective (``eagle2.training.objectives.hass``); its own weight
kind so that a model names it beside the EAGLE head it was warm-started from."""

from __future__ import annotations

from eagle2.heads.eagle_head import load_head, save_head
from eagle2.heads.kinds import WeightKind

WEIGHT_KIND = WeightKind("hass_head", load_head, save_head)
