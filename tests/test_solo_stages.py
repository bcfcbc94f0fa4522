"""The stages of the objectives trained alone through ``objectives.solo_stage`` (P-EAGLE, DFlash, PARD): each runs
from its ``train.<stage>`` section on a token corpus (online features, the module's own taps), stops at
``max_steps`` and exports through its drafter family, with its card; a stage stopped early exports nothing."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from eagle2.training.objectives import objectives
from tests.test_online_features import token_corpus  # noqa: F401  (the fixture)
from tests.test_training import head_cfg, tiny_target

COMMON = dict(autocast="off", target_dtype="same", noise=0.0, epochs=1, max_steps=2, seed=3, stop_after=None)
SECTIONS = {"peagle_head": dict(draft_vocab_size=40, para_depths=3, down_sample_ratio=0.7, down_sample_ratio_min=0.2),
            "dflash_head": dict(layers=1, block_size=4, num_anchors=6, loss_decay_gamma=4),
            "pard_draft": dict(num_layers=1, para_depths=3, down_sample_ratio=0.7, down_sample_ratio_min=0.2,
                               distill=True)}


def stage_cfg(stage: str, corpus, out, **over):
    section = head_cfg(**{**COMMON, **SECTIONS[stage], "out_dir": str(out / "run"), **over})
    export = {stage: str(out / "export"), f"{stage}_max_mb": 5, "dtype": "float32"}
    return OmegaConf.create({"model": {"name": "tiny"},
                             "train": {stage: section, "export": export, "corpus": {"out_dir": str(corpus)}}})


@pytest.mark.parametrize("stage", list(SECTIONS))
def test_a_solo_stage_trains_and_exports_through_its_family(stage, token_corpus, tmp_path):  # noqa: F811
    target, objective = tiny_target(layers=4), objectives()[stage]
    assert objective.run(target, None, stage_cfg(stage, token_corpus, tmp_path / "early", stop_after=1),
                         tmp_path) is None  # stopped before its end: nothing exported
    folder = objective.run(target, None, stage_cfg(stage, token_corpus, tmp_path), tmp_path)
    assert folder == tmp_path / "export" and objective.family.load(folder, target) is not None
    card = json.loads((folder / "training.json").read_text())
    assert card["recipe"]["seed"] == 3 and card["summary"]["step"] == 2 and card["corpus_shards"]
