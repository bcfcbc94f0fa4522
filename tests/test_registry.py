"""``conf/`` as the registry (``eagle2.registry``): every method and benchmark YAML carries its display
keys, those keys never reach the config hash, benchmarks are discovered (a registered benchmark is never
skipped when training corpora drop benchmark questions) and the published table is read by its own header."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import eagle2.bench  # noqa: F401  (registers the config resolvers)
import eagle2.registry as registry
from analysis.tables import PUBLISHED, load_published
from eagle2.prompts.questions import all_benchmark_questions
from eagle2.results.store import config_hash

ROOT = Path(__file__).resolve().parents[1]
CONTRACT_ORDERS = {"plain": 0, "sps": 10, "pld": 20, "medusa": 50, "eagle": 60, "eagle2": 70, "eagle3": 80,
                   "oracle": 90}


def config(*overrides):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize("name", registry.known_methods())
def test_a_method_yaml_says_how_it_is_shown(name):
    raw = OmegaConf.load(registry.METHOD_DIR / f"{name}.yaml")
    assert isinstance(raw.get("display"), str) and isinstance(raw.get("order"), int)
    assert registry.method(name).order == CONTRACT_ORDERS.get(name, raw.order)


def test_benchmarks_come_from_conf_dataset_in_their_order():
    assert registry.known_benchmarks() == ["mt_bench", "humaneval", "gsm8k", "alpaca", "cnn_dm", "nq"]
    assert [registry.benchmark(b).title for b in ("mt_bench", "nq")] == ["MT-bench", "NaturalQ"]


def test_display_keys_are_not_hashed():
    base = config("method=eagle2")
    assert config_hash(config("method=eagle2", "method.display=Other", "method.order=3")) == config_hash(base)
    assert config_hash(config("method=eagle2", "dataset.title=Other", "dataset.order=3")) == config_hash(base)
    assert config_hash(config("method=eagle2", "method.top_k=5")) != config_hash(base)  # the control


def test_a_registered_benchmark_without_its_file_is_an_error_not_skipped(tmp_path, monkeypatch):
    folder = tmp_path / "dataset"
    folder.mkdir()
    for name in ("mt_bench", "toy"):
        (folder / f"{name}.yaml").write_text(f"name: {name}\ntitle: {name}\norder: 1\n")
    monkeypatch.setattr(registry, "DATASET_DIR", folder)
    with pytest.raises(FileNotFoundError, match="toy"):
        all_benchmark_questions()


def test_the_published_table_is_read_by_its_own_header(tmp_path):
    lines = PUBLISHED.read_text().splitlines()
    header = next(ln for ln in lines if ln.startswith("# Columns:")).split(":", 1)[1].strip().split("\t")
    swap = [0, 1, 2, *reversed(range(3, len(header)))]  # benchmark columns in reverse order
    reordered = [ln for ln in lines if ln.startswith("#") and not ln.startswith("# Columns:")]  # its models
    reordered += ["# Columns: " + "\t".join(header[i] for i in swap)]
    reordered += ["\t".join(ln.split("\t")[i] for i in swap) for ln in lines if ln and not ln.startswith("#")]
    (tmp_path / "t.tsv").write_text("\n".join(reordered) + "\n")
    key = ["temperature", "model", "method", "dataset"]
    ours = load_published(tmp_path / "t.tsv").sort_values(key).reset_index(drop=True)
    assert ours.equals(load_published().sort_values(key).reset_index(drop=True))
    assert set(ours.dataset) == {*registry.known_benchmarks(), "mean"}
