"""The GPU recipes ``train=vicuna7b`` (EAGLE-2 head, ShareGPT's own answers, online features) and ``train=llama31_8b``
(EAGLE-3 head, the target's own answers, 7 steps weighted 0.8^i) compose with the authors' settings and
dry-run end to end through the real stages (corpus -> training -> export -> loading back) on a tiny random
Llama at a tiny shape (no weights downloaded; CPU, seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from eagle2.training.corpora.prompts import build_corpus
from eagle2.training.features import corpus_tap_layers
from eagle2.training.objectives.eagle import head_stage
from eagle2.training.objectives.eagle3 import eagle3_stage
from eagle2.training.shards import write_token_shard
from tests.test_training import PROMPTS, ByteTokenizer, tiny_target, train_losses

CONF = Path(__file__).resolve().parents[1] / "conf"


def recipe(name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose(config_name="train_head", overrides=[f"train={name}", *overrides])


def test_vicuna7b_recipe_has_the_authors_eagle2_settings():
    cfg = recipe("vicuna7b")
    h = cfg.train.head
    assert cfg.model.name == "vicuna7b" and cfg.model.hub_id == "lmsys/vicuna-7b-v1.3"
    assert cfg.train.corpus.out_dir == cfg.train.sharegpt.out_dir  # ShareGPT's own answers, as token shards
    assert cfg.train.sharegpt.max_tokens == 2048 and not h.init_from and not h.cls_vocab_size
    assert (h.lr, list(h.betas), h.epochs, h.w_reg, h.w_cls, h.noise, h.grad_clip) == (
        3e-5, [0.9, 0.95], 20, 1.0, 0.1, 0.1, 0.5)
    assert h.token_budget == 4 * 2048 and h.max_batch == 4 and h.resident_shards
    assert not str(cfg.train.export.head).startswith("yuhuili")  # never over the authors' hub id


def test_llama31_8b_recipe_has_the_authors_eagle3_settings():
    cfg = recipe("llama31_8b")
    e = cfg.train.eagle3
    assert cfg.model.name == "llama31_8b" and cfg.train.corpus.responses == "self"
    assert cfg.train.corpus.tap_layers == "eagle3"
    assert (e.unroll, e.step_decay, e.unroll_cls_fraction, e.draft_vocab_size) == (7, 0.8, 1.0, 32000)
    assert (e.lr, list(e.betas), e.epochs, e.warmup, e.grad_clip) == (5e-5, [0.9, 0.95], 40, 12000, 0.5)
    assert e.token_budget == 2 * 2048 and e.max_batch == 2


TINY = ("epochs=1", "max_steps=3", "token_budget=512", "max_batch=4", "warmup=1", "val_max_sequences=4",
        "checkpoint_every=2", "log_every=1", "resident_shards=2")


@pytest.mark.parametrize("name, section, kind", [("vicuna7b", "head", "head"), ("llama31_8b", "eagle3", "eagle3")])
def test_recipe_dry_runs_on_a_tiny_llama(name, section, kind, tmp_path):
    cfg = recipe(name, *(f"train.{section}.{o}" for o in TINY), "train.work_dir=work",
                 f"train.export.{'head' if kind == 'head' else 'eagle3_head'}=export",
                 *(["train.eagle3.draft_vocab_size=48"] if kind == "eagle3" else []))
    target = tiny_target(layers=6)  # a LlamaForCausalLM, the family of both targets
    c = cfg.train.corpus
    if kind == "head":  # ShareGPT's format: token shards (answer spans), trained with online features
        g = torch.Generator().manual_seed(0)
        (tmp_path / c.out_dir).mkdir(parents=True)
        for k in range(4):
            convs = [(torch.randint(3, 64, (40 + 8 * i,), generator=g).tolist(), [(10, 20), (30, 40 + 8 * i)])
                     for i in range(4)]
            write_token_shard(tmp_path / c.out_dir / f"tokens_{k:05d}.npz", convs)
    else:  # the target's own answers, with the tapped layers' features
        assert c.responses == "self"
        build_corpus(target, ByteTokenizer(), PROMPTS, tmp_path / c.out_dir, template="vicuna", system_prompt="S",
                     batch_size=2, max_new_tokens=16, max_prompt_tokens=128, temperature=c.temperature,
                     samples_per_prompt=1, seed=0, tap_layers=corpus_tap_layers(target, c.tap_layers))
    stage = head_stage if kind == "head" else eagle3_stage
    folder = stage(target, ByteTokenizer(), cfg, tmp_path)
    assert folder == tmp_path / "export"
    if kind == "head":
        from eagle2.heads.eagle_head import load_head

        load_head(folder, target)
    else:
        from eagle2.heads.eagle3_head import load_eagle3_head

        head = load_eagle3_head(folder, target)
        assert head.draft_vocab_size == 48
    card = json.loads((folder / "training.json").read_text())
    assert card["recipe"]["lr"] == cfg.train[section].lr and card["summary"]["step"] == 3
    rows = train_losses(tmp_path / cfg.train[section].out_dir, "world_size")
    assert sorted(rows) == [1, 2, 3] and set(rows.values()) == {1}
    state = torch.load(tmp_path / cfg.train[section].out_dir / "checkpoint.pt", weights_only=True)
    wired = {"unroll": 7, "step_decay": 0.8, "resident_shards": 2} if kind == "eagle3" else {"features": "online"}
    assert {k: state["fingerprint"].get(k) for k in wired} == wired  # the recipe reached the trainer


def test_the_recipe_runs_every_declared_objective(monkeypatch):
    """The training stages are the objectives that ``objectives/`` declares (``stage=all`` in their order), and
    the recipe runs one it has never heard of: a new objective is its module and its config section."""
    from eagle2.training import recipe as stages
    from eagle2.training.objectives import Objective, objectives

    shipped = ["head", "eagle3", "draft", "medusa", "hydra", "joint"]  # a new objective may join them anywhere
    assert [stage for stage in objectives() if stage in shipped] == shipped
    assert stages.STAGES == ("corpus", "head", "eagle3", "draft", "medusa", "eval")
    assert {"joint", "hydra", "hass"} <= set(stages.EXTRA_STAGES) and "medusa" not in stages.DATA_PARALLEL_STAGES
    ran = []
    mine = Objective("mine", "my head", lambda target, tokenizer, cfg, root: ran.append(cfg) or Path("out/mine"))
    monkeypatch.setattr(stages, "OBJECTIVES", {**stages.OBJECTIVES, "mine": mine})
    monkeypatch.setattr(stages, "EXTRA_STAGES", (*stages.EXTRA_STAGES, "mine"))
    stages.run_stages(None, None, "cfg", Path("."), "mine")
    assert ran == ["cfg"]


def test_the_recipe_runs_and_checks_every_declared_corpus_source(monkeypatch, tmp_path):
    """The corpus stages are the sources that ``corpora/`` declares; the recipe runs one it has never heard of
    on its own config section, the preflight checks the files it names and the shards of the source it needs,
    and ``stage=list`` shows it: a new source is its module and its config section."""
    from omegaconf import OmegaConf

    from eagle2.training import recipe as stages
    from eagle2.training.corpora import CorpusSource, sources

    assert list(sources()) == ["corpus", "conversations", "features", "own_answers", "sharegpt"]
    assert stages.STAGES[0] == "corpus" and set(sources()) - {"corpus"} <= set(stages.EXTRA_STAGES)
    built = []
    mine = CorpusSource("mine", "my shards", lambda target, tokenizer, c, root: built.append(c.size) or c.out_dir,
                        needs="sharegpt", files=("seeds",))
    monkeypatch.setattr(stages, "SOURCES", {**stages.SOURCES, "mine": mine})
    monkeypatch.setattr(stages, "EXTRA_STAGES", (*stages.EXTRA_STAGES, "mine"))
    section = {"size": 3, "out_dir": "out", "source": "tokens", "seeds": ["seeds.txt"]}
    with pytest.raises(stages.PreflightError, match="stage=mine reads its settings from train.mine, which"):
        stages.check_inputs(OmegaConf.create({"train": {"name": "t"}}), tmp_path, ("mine",))
    cfg = OmegaConf.create({"train": {"name": "t", "mine": section}})
    with pytest.raises(stages.PreflightError, match=r"stage=mine reads train.mine.seeds, and .*seeds.txt does not"):
        stages.check_inputs(cfg, tmp_path, ("mine",))
    (tmp_path / "seeds.txt").write_text("a seed")
    with pytest.raises(stages.PreflightError, match=r"train.mine.source=.*first with train_head.py stage=sharegpt"):
        stages.check_inputs(cfg, tmp_path, ("mine",))
    (tmp_path / "tokens").mkdir()
    (tmp_path / "tokens" / "tokens_00000.npz").write_bytes(b"")
    stages.check_inputs(cfg, tmp_path, ("mine",))
    stages.run_stages(None, None, cfg, tmp_path, "mine")
    assert built == [3]
    listed = [line.split()[0] for line in stages.stage_table().splitlines()[1:]]
    assert listed == [*stages.STAGES, *stages.EXTRA_STAGES] and "mine" in listed and "joint" in listed
