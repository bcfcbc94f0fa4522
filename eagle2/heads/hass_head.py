"""The HASS head's weights (``model.hass_head``): an EAGLE-1 head in its published format
(``eagle2.heads.eagle_head``), trained by HASS's objective (``eagle2.training.objectives.hass``); its own drafter
family so that a model names it beside the EAGLE head it was warm-started from."""

from __future__ import annotations

from eagle2.heads.eagle_head import load_head, save_head
from eagle2.heads.family import Family

FAMILY = Family("hass_head", load_head, save_head, fixture="tests.zoo_fixtures:write_published_head",
                doc="HASS-trained EAGLE-1 head (the EAGLE head's format) for method=hass")
