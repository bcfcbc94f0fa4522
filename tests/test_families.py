"""Drafter families (``eagle2.heads.family``): each declared once, and that one declaration is what the
registry, the model configs, training's export and the zoo's checkpoint writers use."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf

from eagle2.heads.family import Family, families
from eagle2.registry import CONF_DIR, known_methods, method_spec
from eagle2.training.objectives import objectives
from eagle2.training.support.models import export


def test_every_family_is_a_model_config_key_and_every_method_weight_a_family():
    base = OmegaConf.load(CONF_DIR / "model" / "_base.yaml")
    missing = [key for key in families() if key not in base or base[key] is not None]
    assert not missing, f"conf/model/_base.yaml lacks `{missing[0]}: null` (model.{missing[0]}= would be refused)"
    for name in known_methods():
        spec = method_spec(OmegaConf.create({"name": name}))
        assert set(spec.weights) <= set(families()), f"method={name} needs weights no family declares"


def test_every_trained_family_is_exported_and_read_back_through_its_declaration():
    for objective in objectives().values():
        if objective.export_key is not None:
            assert objective.family is families()[objective.family.key], objective.stage


def test_export_writes_through_the_family_save(tmp_path):
    written = []

    def save(module, folder, dtype=None):
        written.append((module, dtype))
        Path(folder).mkdir(parents=True)
        torch.save({}, Path(folder) / "model.safetensors")
        return folder

    cfg = OmegaConf.create({"model": {"name": "t"}, "train": {
        "export": {"mine": "out", "mine_max_mb": 1, "dtype": "float16"}, "corpus": {}, "mine": {"lr": 1}}})
    module = torch.nn.Linear(2, 2)
    folder = export(module, Family("mine", load=None, save=save), {"corpus_shards": []}, cfg, tmp_path,
                    kind="mine", export_key="mine")
    assert written == [(module, torch.float16)] and (folder / "training.json").is_file()
