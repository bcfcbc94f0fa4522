"""Adaptive drafting depth (``method.adaptive_depth=true`` with ``total_tokens=auto``): each round drafts to the
depth the cost profile prices best on the row's last full-depth draft, with a full-depth round every ``EXPLORE``
rounds; the output stays the target's own (greedy: plain decoding's tokens)."""

from __future__ import annotations

import pytest

import eagle2.core.engine as engine
import eagle2.drafters.budget as budget
import eagle2.drafters.eagle2_dynamic as dynamic
from eagle2.core.sampling import SamplingParams
from tests.conftest import tiny_head, tiny_llama

GREEDY = SamplingParams()
PROMPT = [2, 5, 3, 7]


@pytest.fixture(scope="module")
def tiny():
    target = tiny_llama(vocab=16, layers=2, seed=0, scale=10.0)  # peaky: drafts worth something
    return target, tiny_head(target, seed=2)


def drafter(tiny, draft_s, adaptive=True, top_k=3, slope=0.01):
    target, head = tiny
    prof = budget.CostProfile([1.0 + slope * q for q in range(40)], list(draft_s), 16, {})
    return dynamic.Eagle2Drafter(head, target.lm_head, target.device, depth=3, top_k=top_k, total_tokens=8,
                                 profile=prof, adaptive_depth=adaptive)


def depths(out) -> list[int]:
    """The deepest node each round drafted (the per-node records hold every drafted node, kept or not)."""
    deepest: dict[int, int] = {}
    for round_idx, depth in zip(out.nodes["round"], out.nodes["depth"]):
        deepest[round_idx] = max(deepest.get(round_idx, 0), depth)
    return [deepest[i] for i in range(len(out.rounds))]


def test_costly_depth_is_drafted_only_to_refresh_the_estimate(tiny):
    """Drafting past depth 1 costs 10x a verify: after the first (full) round every round drafts to depth 1
    but the exploring ones, every ``EXPLORE`` rounds; the tokens are plain decoding's."""
    plain = engine.generate(tiny[0], dynamic.Eagle2Drafter(tiny[1], tiny[0].lm_head, tiny[0].device, depth=1,
                                                          top_k=1, total_tokens=1), PROMPT, GREEDY, 24, set())
    out = engine.generate(tiny[0], drafter(tiny, [0.01, 10.0, 20.0]), PROMPT, GREEDY, 24, set())
    seen = depths(out)
    assert seen == [r.drafter["draft_depth"] for r in out.rounds]  # what rows record is what was drafted
    assert seen[0] == 3 and 1 in seen
    assert all(d == (3 if i % dynamic.EXPLORE == 0 else 1) for i, d in enumerate(seen)), seen
    assert out.output_ids == plain.output_ids


def test_free_drafting_keeps_the_full_depth(tiny):
    """Free drafting and a flat verify: each deeper node of a chain adds expected tokens at no cost."""
    out = engine.generate(tiny[0], drafter(tiny, [0.0, 0.0, 0.0], top_k=1, slope=0.0), PROMPT, GREEDY, 24, set())
    assert set(depths(out)) == {3}


def test_off_by_default_and_needs_an_auto_budget(tiny):
    out = engine.generate(tiny[0], drafter(tiny, [0.01, 10.0, 20.0], adaptive=False), PROMPT, GREEDY, 24, set())
    assert set(depths(out)) == {3} and all("draft_depth" not in r.drafter for r in out.rounds)
    with pytest.raises(ValueError, match="adaptive_depth"):
        dynamic.Eagle2Drafter(tiny[1], tiny[0].lm_head, tiny[0].device, depth=3, top_k=3, total_tokens=8,
                              adaptive_depth=True)


def test_built_from_a_config_its_profile_times_fixed_depths(tiny, tmp_path):
    """``build_drafter`` measures the profile with drafters at each fixed depth (an adaptive one needs a profile
    to exist), then decodes adaptively: the target's tokens."""
    from omegaconf import OmegaConf

    from eagle2.bench.methods import build_drafter

    method = OmegaConf.create({"name": "eagle2", "depth": 3, "top_k": 3, "total_tokens": "auto",
                               "max_total_tokens": 8, "adaptive_depth": True, "profile_dir": str(tmp_path)})
    built = build_drafter(method, tiny[0], GREEDY, None, head=tiny[1])
    assert built.adaptive and built.profile is not None and len(built.profile.draft_s) == 3
    plain = engine.generate(tiny[0], dynamic.Eagle2Drafter(tiny[1], tiny[0].lm_head, tiny[0].device, depth=1,
                                                          top_k=1, total_tokens=1), PROMPT, GREEDY, 16, set())
    assert engine.generate(tiny[0], built, PROMPT, GREEDY, 16, set()).output_ids == plain.output_ids
