"""The identity audit tells numeric drift from algorithmic errors (eagle2.bench.identity, analysis.identity).

Unit tests classify hand-made logits; the end-to-end test runs SmolLM2 in bf16 (where outputs drift
from plain decoding at near-ties) and shows the audit finds only numeric divergences for a lossless
method, and algorithmic ones when the greedy acceptance rule is deliberately broken (a drafted token
that is the target's SECOND choice is accepted too).
"""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir

import eagle2.core.engine as engine
from analysis.identity import identity_table
from eagle2.bench.data import PROJECT_ROOT
from eagle2.bench.identity import audit_results, classify, tolerance
from eagle2.bench.runner import run
from tests.broken_rules import accept_second_choice_too


def logits_with_margins(margins: list[dict[int, float]], vocab: int = 6, scale: float = 20.0) -> torch.Tensor:
    """(L, vocab) logits: token 0 is the maximum (``scale``), others ``scale - 10`` unless given a margin."""
    z = torch.full((len(margins), vocab), scale - 10.0, dtype=torch.float64)
    z[:, 0] = scale
    for i, given in enumerate(margins):
        for token, margin in given.items():
            z[i, token] = scale - margin
    return z


def test_tolerance_follows_dtype_precision_and_logit_scale():
    z = logits_with_margins([{}])
    bf16, fp32 = float(tolerance("bfloat16", z)), float(tolerance("float32", z))
    assert bf16 == pytest.approx(4.0 * 2**-7 * 20.0) and fp32 == pytest.approx(16.0 * 2**-23 * 20.0)
    assert float(tolerance("bf16", 2 * z)) == pytest.approx(2 * bf16)


def test_classify_identical_numeric_and_algorithmic():
    near, far = 0.3, 3.0  # bf16 tolerance here: 0.625 logits
    z = logits_with_margins([{}, {1: near}, {2: far}])
    assert classify(z, [0, 0, 0], [0, 0, 0], "bfloat16")["status"] == "identical"
    numeric = classify(z, [0, 1, 0], [0, 0, 0], "bfloat16")  # split at a near-tie, then greedy
    assert numeric["status"] == "numeric" and numeric["first_divergence"] == 1 and numeric["off_greedy"] == []
    assert classify(z, [0, 0, 2], [0, 0, 0], "bfloat16")["status"] == "algorithmic"  # a far token
    later = classify(z, [0, 1, 2], [0, 0, 0], "bfloat16")  # numeric split, then a far token: still caught
    assert later["status"] == "algorithmic" and later["off_greedy"] == [2]
    assert classify(z, [0, 1, 0], [0, 0, 0], "float32")["status"] == "algorithmic"  # fp32 resolves 0.3
    other_prompt = classify(z, [0, 1, 0], None, "bfloat16")  # earlier answers differed: own path only
    assert other_prompt["status"] == "numeric" and other_prompt["prompt_differs"]


def _config(*overrides):
    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=["logger=none", "warmup_tokens=0", "dataset=mt_bench",
                                            "dataset.limit=1", "max_new_tokens=32", *overrides])


def test_bf16_divergences_are_numeric_and_a_broken_rule_is_algorithmic(tmp_path, monkeypatch):
    good, bad = tmp_path / "good", tmp_path / "bad"
    for results in (good, bad):
        run(_config("method=plain", f"paths.results={results}"))
    run(_config("method=eagle2", "method.total_tokens=8", f"paths.results={good}"))
    audit_results(good)
    table = identity_table(good)
    assert table.dtype.tolist() == ["bfloat16"] and table.turns.sum() == 2
    assert table.algorithmic.sum() == 0 and table.unaudited.sum() == 0
    assert (table.identical + table.numeric).sum() == 2

    monkeypatch.setattr(engine, "accept_greedy", accept_second_choice_too)
    run(_config("method=eagle2", "method.total_tokens=8", f"paths.results={bad}"))
    monkeypatch.undo()
    audit_results(bad)
    assert identity_table(bad).algorithmic.sum() >= 1
