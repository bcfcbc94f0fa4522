"""Drafter families (``eagle2.heads.family``): each declared once, and that one declaration is what the
registry, the model configs, training's export and the zoo's checkpoint writers use."""

from __future__ import annotations

from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import eagle2.bench.known_keys as known_keys
import eagle2.heads.family
from eagle2.bench import family_keys
from eagle2.heads.family import Family, families
from eagle2.registry import CONF_DIR, known_methods, method_spec
from eagle2.training.objectives import objectives
from eagle2.training.support.models import export


def model_config(*overrides: str):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=["model=vicuna7b", *overrides]).model


def test_a_declared_family_is_a_model_key_null_by_default_that_the_command_line_sets(monkeypatch):
    """No YAML names the key: its declaration alone makes ``model.<key>`` (the node ``model/_families`` that
    ``conf/model/_base.yaml`` lists), and the known keys' cache is a new one for it."""
    before = known_keys._conf_fingerprint(str(CONF_DIR))
    declared = {**families(), "toy_head": Family("toy_head", load=None, save=None, doc="a toy family's weights")}
    monkeypatch.setattr(eagle2.heads.family, "families", lambda: declared)
    family_keys.register()
    try:
        model = model_config()
        assert set(declared) <= set(model) and model.toy_head is None
        assert model_config("model.toy_head=/some/dir").toy_head == "/some/dir"
        assert model_config("model.head=/some/dir").head == "/some/dir"
        assert known_keys._conf_fingerprint(str(CONF_DIR)) != before
    finally:
        monkeypatch.undo()
        family_keys.register()
    assert "toy_head" not in model_config()


def test_every_method_weight_is_a_family():
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
