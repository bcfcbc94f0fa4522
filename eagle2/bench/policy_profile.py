"""The cost profile ``method.policy=pays`` decides with (``eagle2.drafters.policy``), and the drafter it wraps.

A method with an auto budget already prices its rounds with a profile (``eagle2.bench.cost_profile``: the
target's verify curve and the head's drafting cost per depth); the policy reads the same one. Any other method
(a fixed EAGLE-2 budget, SpS, PLD, Medusa, Hydra, REST, SuffixDecoding, SAMD) gets a profile of its own, measured
once per machine and cached like the others: the target's verify curve ``T_B(q)`` at the run's batch size, and one
drafting round of the method exactly as configured (its propose and its bookkeeping, ``draft_s`` of one entry).
The profile key names the method and a hash of its settings, so two settings never share a drafting cost.
"""

from __future__ import annotations

import hashlib
import json

from omegaconf import OmegaConf

from eagle2.bench import cost_profile
from eagle2.drafters.budget import CostProfile
from eagle2.drafters.policy import PolicyDrafter, resolved_policy

NOT_SETTINGS = ("policy", "profile_dir", "reprofile", "verify_rows", "draft_rows")  # where, or how it is priced


def method_identity(settings: dict) -> str:
    """The method's name and a hash of the settings its drafting cost depends on."""
    kept = {k: v for k, v in settings.items() if k not in NOT_SETTINGS}
    digest = hashlib.sha1(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{settings.get('name')}:{digest}"


def policy_profile(method_cfg, target, chosen: dict, build_at) -> CostProfile:
    """The profile of ``method_cfg`` on this machine: its auto budget's when it has one (``chosen``), one handed in
    (``chosen["policy_profile"]``, as tests plant them), else measured (see the module's docstring).
    ``build_at(cfg)`` builds the method's drafter for a config."""
    for given in ("cost_profile", "policy_profile"):
        if chosen.get(given) is not None:
            return chosen[given]
    settings = OmegaConf.to_container(method_cfg, resolve=True)
    always = OmegaConf.create({**settings, "policy": "always"})
    rows = int(settings.get("verify_rows") or 1)
    together = rows > 1 and int(settings.get("draft_rows") or 1) > 1 and hasattr(type(build_at(always)),
                                                                                  "propose_batch")
    cap = max(int(settings.get(cap) or 64) for cap in cost_profile.BUDGET_KEYS.values())
    return cost_profile.get_profile(target, None, {"method": method_identity(settings)}, lambda d: build_at(always),
                                    depth=1, top_k=0, profile_dir=settings.get("profile_dir"),
                                    remeasure=bool(settings.get("reprofile")), max_q=cap + 1, rows=rows,
                                    draft_rows=rows if together else 1)


def with_policy(drafter, method_cfg, target, chosen: dict, build_at):
    """``drafter`` under the method's ``policy``: wrapped by ``PolicyDrafter`` when it is ``pays``."""
    if resolved_policy(method_cfg, chosen.get("cost_profile") is not None) != "pays":
        return drafter
    profile = policy_profile(method_cfg, target, chosen, build_at)
    return PolicyDrafter(drafter, profile, depth=int(method_cfg.get("depth") or 1),  # draft_s clamps the depth
                         run_state=chosen.get("run_state"))
