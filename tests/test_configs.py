"""Every config composes; unknown names are refused with the valid choices listed."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

import eagle2.bench  # noqa: F401  (registers the config resolvers the composed configs use)

CONF = Path(__file__).resolve().parents[1] / "conf"


def group_names(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml") if not p.stem.startswith("_"))  # _base: shared keys


# every method with the embedded model and one GPU config by default; the full cross-product is slow
MODELS = [m if m in ("smollm2", "vicuna7b") else pytest.param(m, marks=pytest.mark.slow) for m in group_names("model")]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("method", group_names("method"))
def test_model_method_compose(model, method):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"model={model}", f"method={method}"])
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved["method"]["name"] == method
    assert resolved["model"]["name"] == model
    assert resolved["model"]["template"]
    assert resolved["model"]["head"] or resolved["model"]["eagle3_head"]  # every model has an EAGLE drafter
    if method == "eagle2":
        total = resolved["method"]["total_tokens"]
        assert total == "auto" or total >= 1


@pytest.mark.parametrize("dataset", group_names("dataset"))
def test_dataset_compose(dataset):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"dataset={dataset}", "dataset.limit=3"])
    assert cfg.dataset.name == dataset and cfg.max_new_tokens == cfg.dataset.max_new_tokens


def test_gpu_models_carry_paper_settings():
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["model=vicuna7b"])
    # the authors' evaluation scripts: total_token 60, depth 5, top_k 10 = ours (59, 6, 10) (eagle2.yaml)
    assert cfg.method.total_tokens == 59 and cfg.method.depth == 6 and cfg.method.top_k == 10
    assert cfg.model.head == "yuhuili/EAGLE-Vicuna-7B-v1.3" and cfg.model.sps_draft == "double7/vicuna-68m"
    assert cfg.model.dtype == "float16" and cfg.model.device == "cuda"


def test_unknown_names_list_valid_choices():
    with initialize_config_dir(str(CONF), version_base="1.3"):
        with pytest.raises(MissingConfigException) as err:
            compose("config", overrides=["method=nonsense"])
    assert "eagle2" in str(err.value) and "plain" in str(err.value)


@pytest.mark.parametrize("experiment", group_names("experiment"))
def test_every_experiment_composes_with_its_sweep(experiment):
    """Every named experiment composes, names its results folder and sweeps at least one key."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={experiment}"], return_hydra_config=True)
    assert cfg.paths.results != "results", f"experiment={experiment} writes into the default results folder"
    assert cfg.hydra.sweeper.params, f"experiment={experiment} sweeps nothing"


def test_four_methods_sweeps_the_four_methods_on_two_benchmarks():
    from eagle2.bench.resolvers import register

    register()  # (the scale's interpolations; other tests register them too, but not when this one runs alone)
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=four_methods"], return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    assert params.method.split(",") == ["plain", "sps", "eagle", "eagle2"]
    assert params.dataset.split(",") == ["mt_bench", "gsm8k"]
    assert (cfg.dataset.limit, cfg.max_new_tokens, cfg.temperature, cfg.logger.name) == (3, 64, 0.0, "none")  # _scale
