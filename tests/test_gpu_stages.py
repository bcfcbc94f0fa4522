"""The GPU check's random-model stages (experiments.gpu_check.stages) at CPU-proxy size, and their negative
controls: a broken acceptance rule and a broken cache commit make the audits fail."""

from __future__ import annotations

import math

import pytest

from eagle2.core import engine
from experiments.gpu_check import stages as gs
from tests.broken_rules import accept_second_choice_too


def run(stage: str) -> dict:
    rows: list[dict] = []
    gs.run_stage(stage, gs.scale_for("cpu"), gs.row_writer(None, rows))
    return rows[0]


@pytest.mark.parametrize("stage", ["audit_fp16", "exact_fp32"])
def test_stage_passes_and_drafts_are_accepted(stage):
    row = run(stage)
    assert row["status"] == "ok" and row["criterion"] and row["accepted"] >= 1, row
    if stage.startswith("audit"):  # the half model's logits measured against the reference: a real spread
        assert 0 < row["error_ratio_p99"] <= row["error_ratio_max"] < math.inf and row["tolerance_factor"] > 0, row


def test_broken_acceptance_fails_the_audit(monkeypatch):
    monkeypatch.setattr(engine, "accept_greedy", accept_second_choice_too)
    row = run("audit_fp16")
    assert row["status"] == "failed" and row["algorithmic"] >= 1, row


@pytest.mark.parametrize("stage", ["audit_fp16", "exact_fp32"])
def test_broken_commit_fails(stage, monkeypatch):
    real = engine.keep_tree_path
    monkeypatch.setattr(engine, "keep_tree_path", lambda c, p, nodes: real(c, p, list(range(len(nodes)))))
    assert run(stage)["status"] == "failed"
