"""GPU configs follow the EAGLE authors' evaluation protocol (their eagle/evaluation/gen_ea_answer_*.py):
token limits, system prompts and templates, full-question warm-ups, an end-to-end rate beside the
decode-only one; device-type keyed scales; and the SmolLM2 (CPU) configs keep every hash they had."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from analysis.metrics import iter_rows
from eagle2.bench import rows, runner, turns
from eagle2.bench.resolvers import device_type
from eagle2.core.engine import ContextOverflowError
from eagle2.prompts.chat import encode_conversation
from eagle2.results.store import config_hash
from experiments.research.recipe import EXPERIMENTS

ROOT = Path(__file__).resolve().parents[1]
AUTHORS_SYSTEM = "You are a helpful, respectful and honest assistant. Always answer as helpfully as possible"


def cfg_of(*overrides):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def resolved(*overrides) -> dict:
    return OmegaConf.to_container(cfg_of(*overrides), resolve=True)


@pytest.mark.parametrize("device,gpu", [("cpu", False), ("cuda", True), ("cuda:0", True), ("cuda:1", True),
                                        ("mps", True)])
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_scales_by_device_type(name, device, gpu):
    cfg = resolved(f"experiment={name}", "model=vicuna7b", f"model.device={device}")
    if gpu:  # the paper's protocol: all questions, the authors' limit (eagenerate's default)
        assert cfg["dataset"]["limit"] is None and cfg["max_new_tokens"] == 512
    else:
        assert 1 <= cfg["dataset"]["limit"] <= 10 and cfg["max_new_tokens"] == 64  # batch_scaling: 10


def test_device_type_names_a_bad_device():
    assert [device_type(d) for d in ("cpu", "cuda", "cuda:3", "mps")] == ["cpu", "cuda", "cuda", "mps"]
    with pytest.raises(ValueError, match="not a device"):
        device_type("cuda:x")


@pytest.mark.parametrize("model,limit", [("vicuna7b", 512), ("vicuna13b", 512), ("llama2chat7b", 512),
                                         ("llama2chat13b", 512), ("llama2chat70b", 512), ("llama3_8b", 512),
                                         ("llama3_70b", 512), ("llama31_8b", 512), ("llama33_70b", 512)])
def test_gpu_models_compose_with_the_authors_protocol(model, limit):
    cfg = resolved(f"model={model}", "dataset=nq")  # nq's own limit is 128: the model's protocol wins
    m = cfg["model"]
    assert cfg["max_new_tokens"] == m["max_new_tokens"] == limit
    assert m["max_context"] == 2048 - 60 - 10  # eagenerate's max_length, less total_token and 10: prompt + output
    assert cfg["warmup_questions"] == 3 and m["stop_at_context"] is True
    if model.startswith("vicuna"):
        assert m["template"] == "vicuna" and m["system_prompt"] is None  # FastChat's vicuna_v1.1 system line
    else:
        assert m["system_prompt"].startswith(AUTHORS_SYSTEM)
    if model in ("llama31_8b", "llama33_70b"):
        assert m["template"] == "tokenizer"  # the checkpoint's template, with its date block
    assert (m["device_map"] == "auto") == model.endswith("70b")


# make test starts run.py for vicuna7b; llama31_8b's protocol (its template, system prompt) is composed by default in
# test_gpu_models_compose_with_the_authors_protocol, and through run.py in CI after make test (heavy)
@pytest.mark.parametrize("model,limit,template", [
    ("vicuna7b", 512, "vicuna"), pytest.param("llama31_8b", 512, "tokenizer", marks=pytest.mark.heavy)])
def test_run_py_composes_the_authors_protocol(model, limit, template):
    """`python run.py model=vicuna7b` itself (its @hydra.main and resolvers), not only compose()."""
    done = subprocess.run([sys.executable, "run.py", f"model={model}", "--cfg", "job", "--resolve"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    cfg = yaml.safe_load(done.stdout)
    m = cfg["model"]
    assert cfg["max_new_tokens"] == limit and cfg["warmup_questions"] == 3 and cfg["temperature"] == 0.0
    assert cfg["dataset"]["limit"] is None and m["device"] == "cuda" and m["template"] == template
    assert m["eagle2"] == {"total_tokens": 59, "depth": 6, "top_k": 10}  # their (60, 5, 10)
    assert (m["system_prompt"] or "").startswith(AUTHORS_SYSTEM) == (model != "vicuna7b")


def test_smollm2_keeps_its_defaults():
    cfg = resolved()
    assert cfg["max_new_tokens"] == 256 and cfg["warmup_questions"] == 0 and cfg["warmup_tokens"] == 32
    assert cfg["model"]["stop_at_context"] is False and cfg["model"]["device_map"] is None


# hashes of SmolLM2 configs computed before the protocol keys existed (commit a95b214): rows stay found
PINNED = {("float32", ()): "ccffab1412", ("float32", ("method=plain",)): "d60da676f5",
          ("float32", ("method=eagle", "dataset=gsm8k")): "5fe8a763b2",
          ("float32", ("method=eagle3", "dataset=nq", "temperature=1.0")): "f0e405fa06",
          ("float32", ("experiment=table1", "method=eagle2", "dataset=humaneval")): "f1c2894195",
          ("bfloat16", ()): "c221a4414e", ("bfloat16", ("experiment=fig1", "method=sps")): "6c07f387b0"}


@pytest.mark.parametrize("dtype,overrides", list(PINNED))
def test_smollm2_config_hashes_unchanged(dtype, overrides):
    assert config_hash(cfg_of(f"model.dtype={dtype}", *overrides)) == PINNED[dtype, overrides]


def test_llama31_prompt_uses_the_tokenizer_template_with_its_date_block(tmp_path):
    from transformers import AutoTokenizer

    from tests.zoo_fixtures import write_tokenizer

    tok = AutoTokenizer.from_pretrained(write_tokenizer(tmp_path, 128256))
    m = cfg_of("model=llama31_8b").model
    ids = encode_conversation(tok, m.template, ["Hi there"], [], m.system_prompt)
    text = tok.decode(ids)
    assert ids.count(128000) == 1 and ids[0] == 128000  # one BOS, from the template
    assert "Cutting Knowledge Date" in text and AUTHORS_SYSTEM in text
    assert text.endswith("assistant<|end_header_id|>\n\n")


def test_stop_at_context_lets_a_long_prompt_decode_until_the_context_is_full():
    long = list(range(1700))  # Vicuna: 2048 context - 512 new tokens leaves room for 1536
    cfg = cfg_of("model=vicuna7b")
    assert rows.fit_prompt(long, cfg, 2048) == long
    cfg.model.stop_at_context = False
    with pytest.raises(ContextOverflowError):
        rows.fit_prompt(long, cfg, 2048)
    cfg.model.stop_at_context = True
    with pytest.raises(ContextOverflowError):  # no room at all: still refused
        rows.fit_prompt(list(range(2048)), cfg, 2048)


def test_warmup_decodes_the_first_question_whole_and_rows_carry_the_end_to_end_rate(tmp_path, monkeypatch, capsys,
                                                                                   shared_target_loads):
    calls = []
    real = runner.generate

    def counting(target, drafter, prompt, params, max_new, *args, **kwargs):
        calls.append((len(prompt), max_new))
        return real(target, drafter, prompt, params, max_new, *args, **kwargs)

    monkeypatch.setattr(runner, "generate", counting)  # the warm-up
    monkeypatch.setattr(turns, "generate", counting)  # the recorded turns
    common = ["logger=none", "method=plain", "dataset=mt_bench", "dataset.limit=1", "max_new_tokens=3",
              "threads=1", "model.dtype=float32"]
    runner.run(cfg_of(*common, "warmup_questions=2", f"paths.results={tmp_path / 'a'}"))
    assert len(calls) == 2 * 2 + 2  # two warm-ups of both MT-bench turns, then the two recorded turns
    assert calls[:2] == calls[2:4] and calls[1][0] > calls[0][0]  # turn 2 sees turn 1's answer
    calls.clear()
    runner.run(cfg_of(*common, "warmup_tokens=5", f"paths.results={tmp_path / 'b'}"))
    assert len(calls) == 1 + 2 and calls[0][1] == 5  # the CPU default: one short generation
    for row in iter_rows(tmp_path / "b"):
        total = row["prefill_time_s"] + row["wall_time_s"]
        assert row["e2e_tokens_per_s"] == pytest.approx(row["new_tokens"] / total)
    assert "tokens/s (end to end, prefill included)" in capsys.readouterr().out
