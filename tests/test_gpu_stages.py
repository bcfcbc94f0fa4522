"""The GPU check's random-model stages (experiments.ops.gpu_check.stages) at CPU-proxy size, and their negative
controls: a broken acceptance rule and a broken cache commit make the audits fail."""

from __future__ import annotations

import math

import pytest
import torch

from eagle2.core import engine
from experiments.ops.gpu_check import stages as gs
from experiments.ops.gpu_check import verify_timing as vt
from tests.broken_rules import accept_second_choice_too

# the GPU check's stages at CPU-proxy size, a GPU machine's tool: in CI after make test (make test-heavy)
pytestmark = pytest.mark.heavy


def run(stage: str) -> dict:
    rows: list[dict] = []
    gs.run_stage(stage, gs.scale_for("cpu"), gs.row_writer(None, rows))
    return rows[0]


@pytest.mark.parametrize("stage", ["audit_vicuna7b", "exact_fp32"])
def test_stage_passes_and_drafts_are_accepted(stage):
    row = run(stage)
    assert row["status"] == "ok" and row["criterion"] and row["accepted"] >= 1, row
    if stage.startswith("audit"):  # the half model's logits measured against the reference: a real spread
        assert 0 < row["error_ratio_p99"] <= row["error_ratio_max"] < math.inf and row["tolerance_factor"] > 0, row


def test_audits_run_in_their_model_configs_dtype(tmp_path, monkeypatch):
    assert gs.config_dtype("vicuna7b") == torch.float16  # every GPU config runs fp16 (conf/model/_base.yaml)
    assert gs.config_dtype("llama31_8b") == torch.float16
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "_base.yaml").write_text("dtype: float16\n")
    (tmp_path / "conf" / "model" / "bf16model.yaml").write_text("dtype: bfloat16\n")
    from experiments.ops.gpu_check import models as gm

    monkeypatch.setattr(gm, "ROOT", tmp_path)  # the model configs are read where the models are built
    assert gs.config_dtype("bf16model") == torch.bfloat16  # where a config says bf16, bf16


def test_the_audit_judges_with_the_factor_it_measured(monkeypatch):
    """The row's factor is the one measured on its model (the suggested factor of its own ratios), every
    turn is judged with it, and the process's factors are as they were afterwards."""
    from eagle2.bench import identity
    from experiments.research.numeric_tolerance import suggested_factor

    used, real = [], identity.classify
    monkeypatch.setattr(identity, "classify", lambda *a, **k: used.append(
        (identity.TOLERANCE_FACTORS["float16"], identity.tolerance_measured("float16"))) or real(*a, **k))
    before = dict(identity.TOLERANCE_FACTORS), set(identity.MEASURED)
    row = run("audit_vicuna7b")
    assert row["tolerance_measured"] and row["dtype"] == "float16", row
    assert suggested_factor(torch.tensor([row["error_ratio_max"]])) == row["tolerance_factor"]
    assert used == [(row["tolerance_factor"], True)] * row["turns"], used
    assert (dict(identity.TOLERANCE_FACTORS), set(identity.MEASURED)) == before


def test_broken_acceptance_fails_the_audit(monkeypatch):
    monkeypatch.setattr(engine, "accept_greedy", accept_second_choice_too)
    row = run("audit_vicuna7b")
    assert row["status"] == "failed" and row["algorithmic"] >= 1, row


@pytest.mark.parametrize("stage", ["audit_vicuna7b", "exact_fp32"])
def test_broken_commit_fails(stage, monkeypatch):
    real = engine.keep_tree_path
    monkeypatch.setattr(engine, "keep_tree_path", lambda c, p, nodes: real(c, p, list(range(len(nodes)))))
    assert run(stage)["status"] == "failed"


def virtual_syncs(vd):
    """``timed_section_syncs``'s counter on virtual devices (``tests.virtual_devices``: reads and copies)."""
    from contextlib import contextmanager

    @contextmanager
    def counting():
        start = vd.syncs
        yield lambda: vd.syncs - start

    return counting


def test_the_verify_criterion_fails_a_host_bound_timed_section(monkeypatch):
    """The timed section of ``measure_verify`` syncs nothing (its inputs are on the device before the
    clock starts); a variant that copies an input from the host inside it is caught by the criterion."""
    from eagle2.bench import cost_profile
    from tests.conftest import tiny_llama
    from tests.virtual_devices import VirtualDevices

    target = tiny_llama(vocab=64, layers=2, seed=0)
    same = [1.0, 1.0]  # equal curves: only the syncs decide
    with torch.no_grad(), VirtualDevices() as vd:
        vd.place(target, "cuda:0")
        syncs = vt.timed_section_syncs(target, 16, (1, 2, 8), virtual_syncs(vd))
        assert syncs == 0 and vt.verify_ok(same, same, same, syncs)
        real = cost_profile.measure_verify

        def host_bound(target, *, timer, **kw):  # the inputs copied from the host inside the timed section
            return real(target, timer=lambda fn, reps, device, q: timer(
                lambda: (torch.zeros(q).to(device), fn()), reps, device, q), **kw)

        monkeypatch.setattr(cost_profile, "measure_verify", host_bound)
        syncs = vt.timed_section_syncs(target, 16, (1, 2, 8), virtual_syncs(vd))
        assert syncs == 1 and not vt.verify_ok(same, same, same, syncs)


def test_the_verify_stage_times_a_sample_of_q():
    """Sized to its limit: the CPU half's verify rows time q = 1, 2, 4, 8 only."""
    row = next(r for r in rows_of("verify_cost") if r["status"])
    assert row["q"] == [1, 2, 4, 8] and len(row["ratio_wall"]) == 4 and row["status"] == "ok", row


def rows_of(stage: str) -> list[dict]:
    rows: list[dict] = []
    gs.run_stage(stage, gs.scale_for("cpu"), gs.row_writer(None, rows))
    return rows


def test_the_half_target_keeps_float32_rotary_tables():
    """As a checkpoint loads (transformers keeps ``inv_freq`` in fp32): the audit's half target must not
    round its rotary angles, or the tolerance it measures is inflated."""
    from experiments.ops.gpu_check import models as gm

    reference = gm.peaked_target(gm.target_config("vicuna7b", 1, 8), "cpu")
    twin = gm.half_copy(reference, torch.float16)
    tables = {n: b for n, b in twin.named_buffers() if n.endswith("inv_freq")}
    assert tables and all(b.dtype == torch.float32 for b in tables.values())
    assert all(torch.equal(b, dict(reference.named_buffers())[n]) for n, b in tables.items())
    assert twin.model.embed_tokens.weight.dtype == torch.float16 and twin.successor is reference.successor


def test_cuda_graphs_stage_checks_the_static_path_on_a_cpu():
    """On a CPU the stage runs the static path (uncompiled) against eager for plain and EAGLE-2 and says the
    graphs were skipped; a static path whose padding leaks into real rows makes it fail."""
    rows: list[dict] = []
    gs.run_stage("cuda_graphs", gs.scale_for("cpu"), gs.row_writer(None, rows))
    assert [r["case"].split(",")[0] for r in rows] == ["plain", "eagle2"]
    assert all(r["status"] == "ok" and r["identical"] and r["graphs"].startswith("skipped") for r in rows), rows
    assert rows[1]["rounds"] < rows[0]["rounds"]  # EAGLE-2 accepted drafts on the planted target


def test_cuda_graphs_stage_fails_on_a_broken_static_path(monkeypatch):
    """The static cache keeps the first nodes of a round instead of the accepted path: EAGLE-2 diverges (in 2 of
    these 6 prompts: the planted target's greedy tokens lean little on the context)."""
    from eagle2.core import compiled

    real = compiled.StaticKV.keep
    monkeypatch.setattr(compiled.StaticKV, "keep",
                        lambda self, prefix, nodes: real(self, prefix, list(range(len(nodes)))))
    import dataclasses

    rows: list[dict] = []
    longer = dataclasses.replace(gs.scale_for("cpu"), prompts=6, new_tokens=64)  # the planted target's greedy
    gs.run_stage("cuda_graphs", longer, gs.row_writer(None, rows))  # tokens lean little on the context: longer
    assert [r["status"] for r in rows] == ["ok", "failed"], rows  # plain keeps no tree; EAGLE-2 does
