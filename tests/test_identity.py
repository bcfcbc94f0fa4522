"""The identity audit tells numeric drift from algorithmic errors (eagle2.bench.identity, its summary).

Unit tests classify hand-made logits; the end-to-end test runs SmolLM2 in bf16 (where outputs drift
from plain decoding at near-ties) and shows the audit finds only numeric divergences for a lossless
method, and algorithmic ones when the greedy acceptance rule is deliberately broken (a drafted token
that is the target's SECOND choice is accepted too).
"""

from __future__ import annotations

import shutil

import pytest
import torch
from hydra import compose, initialize_config_dir

import eagle2.core.engine as engine
from eagle2.bench.identity import audit_results, classify, tolerance
from eagle2.bench.runner import run
from eagle2.prompts.questions import PROJECT_ROOT
from eagle2.results.identity_records import identity_table
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
                                            "model.dtype=bfloat16",  # whatever auto resolves to on this CPU
                                            # 16 tokens: on this CPU the first answer leaves plain decoding
                                            # at token 6 (a bf16 near-tie), and the broken rule by token 8
                                            "dataset.limit=1", "max_new_tokens=16", *overrides])


def test_bf16_divergences_are_numeric_and_a_broken_rule_is_algorithmic(tmp_path, monkeypatch, shared_target_loads):
    good, bad = tmp_path / "good", tmp_path / "bad"
    run(_config("method=plain", f"paths.results={good}"))
    shutil.copytree(good, bad)  # the same plain rows: each config's audit reads its folder's plain config
    run(_config("method=eagle2", "method.total_tokens=8", f"paths.results={good}"))
    audit_results(good)
    table = identity_table(good)
    assert table.dtype.tolist() == ["bfloat16"] and table.turns.sum() == 2
    assert table.algorithmic.sum() == 0 and table.unaudited.sum() == 0
    assert (table.identical + table.numeric).sum() == 2

    with monkeypatch.context() as broken:
        broken.setattr(engine, "accept_greedy", accept_second_choice_too)
        run(_config("method=eagle2", "method.total_tokens=8", f"paths.results={bad}"))
    audit_results(bad)
    assert identity_table(bad).algorithmic.sum() >= 1


def test_half_reference_doubles_the_tolerance():
    z = logits_with_margins([{}, {1: 0.9}])  # bf16 tolerance here: 0.625 logits, 1.25 with a bf16 reference
    assert float(tolerance("bfloat16", z, half_reference=True)[0]) == pytest.approx(2 * float(tolerance("bf16", z)[0]))
    assert classify(z, [0, 1], [0, 0], "bfloat16")["status"] == "algorithmic"
    halved = classify(z, [0, 1], [0, 0], "bfloat16", half_reference=True)
    assert halved["status"] == "numeric" and halved["half_reference"]


def test_float16_tolerance_is_unmeasured_until_a_measured_factor_is_given(caplog, monkeypatch):
    import logging

    import eagle2.bench.identity as identity

    monkeypatch.setattr(identity, "MEASURED", set(identity.MEASURED))
    monkeypatch.setattr(identity, "TOLERANCE_FACTORS", dict(identity.TOLERANCE_FACTORS))
    monkeypatch.setattr(identity, "_warned", set())
    z = logits_with_margins([{}])
    with caplog.at_level(logging.WARNING):
        rec = classify(z, [0], [0], "float16")
    assert rec["tolerance_measured"] is False and "UNMEASURED" in caplog.text and "--device cuda" in caplog.text
    assert classify(z, [0], [0], "bfloat16")["tolerance_measured"] is True
    identity.set_tolerance_factor("fp16", 6.0)
    assert classify(z, [0], [0], "float16")["tolerance_measured"] is True
    assert float(tolerance("float16", z)) == pytest.approx(6.0 * 2**-10 * 20.0)


def test_cli_refuses_an_unmeasured_float16_audit(tmp_path, monkeypatch):
    import pandas as pd

    import eagle2.bench.identity as identity
    from eagle2.identity import main

    monkeypatch.setattr(identity, "MEASURED", set(identity.MEASURED))
    spec = pd.DataFrame({"dtype": ["float16"], "config_hash": ["h"]})
    monkeypatch.setattr(identity, "audit_pairs", lambda results: iter([(tmp_path / "x.jsonl", spec, spec.iloc[:0])]))
    assert main([str(tmp_path)]) == 2  # refused, with the command that measures it
    with pytest.raises(identity.UnmeasuredToleranceError, match="numeric_tolerance --device cuda"):
        identity.audit_results(tmp_path, allow_unmeasured=False)


def test_numeric_tolerance_measures_a_gpu_model_config_on_a_given_device(tmp_path, capsys):
    """``--model vicuna7b --device ...``: the config's template and weights (here a tiny random stand-in)."""
    from transformers import LlamaConfig

    from experiments.research import numeric_tolerance
    from tests.zoo_fixtures import write_target

    folder = write_target(tmp_path / "t", LlamaConfig(vocab_size=32000, hidden_size=32, intermediate_size=64,
                                                      num_hidden_layers=2, num_attention_heads=4))
    numeric_tolerance.main(["--model", "vicuna7b", "--device", "cpu", "--dtype", "bfloat16", "--prompts", "1",
                            "--new-tokens", "6", "--override", f"model.path={folder}"])
    out = capsys.readouterr().out
    assert "vicuna7b on cpu, bfloat16 vs float32: 6 positions" in out
    assert "--tolerance-factor bfloat16=" in out
    assert numeric_tolerance.suggested_factor(torch.tensor([0.5, 3.44])) == 4.5
