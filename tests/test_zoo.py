"""Zoo smoke tests: every GPU model config (conf/model/*.yaml but smollm2 and _base) runs one short turn
of every method through the runner on this CPU, with random weights of that model's shapes, and each
method's output is token-identical to plain decoding in fp32.

Targets are written from the model config's ``architecture`` (its config.json: width, heads, KV heads,
vocabulary, RoPE, norm epsilon) with 1-2 decoder layers, with a byte-level tokenizer that has that
family's vocabulary size and special tokens at their real ids, so the model config's own chat template,
stop tokens and budget (the authors' total_token 60, depth 5, top_k 10) are what run. Drafter weights
come from each drafter family's ``fixture`` writer in its published format (an EAGLE-1/2 head as the
authors publish it, an SpS draft like ``double7/vicuna-68m``); a method whose family names no writer is
skipped with that reason. Passed with ``model.path=``/``model.head=``/``model.sps_draft=``.

Two scales: ``narrow``: every config as a narrow proxy, 8 dimensions per attention head, 2 layers
(vicuna7b by default, the others marked slow); ``true`` (slow): the real width with 1 layer, except the
70B models, whose real width (8192; one layer plus a head is ~10 GB in fp32) is replaced by a 2048-wide
proxy with their 64 heads and 8 KV heads.

One test per (model, method), but the set-up is shared per (model, scale): the checkpoints are written once
when its first test starts, and the runner's target is loaded from disk once (its first run) and handed to every
later method's run (``shared_target_loads``; decoding never changes the target, and a method that did would
make every later method differ from plain); both are deleted when the next (model, scale) starts or the module
ends, so that one worker holds one at a time (a Llama-3-8B-wide one is 5 GB in memory, 10 GB on disk). The slow
tests of one (model, scale) form one xdist group, so that ``--dist loadgroup`` (``make test-slow``) writes and
loads them on one worker only, one after another; the true-width targets over ``LARGE_TARGET_BYTES`` (the two
Llama-3-8B-wide ones) share one group, so that two workers never hold two of them at once (each test holds 7.6 GB
at most: the 5 GB target and a drafter at its width).
"""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path

import pytest
import torch

from eagle2.bench.runner import run
from eagle2.heads.shapes import llama_config
from eagle2.registry import gpu_models, known_methods, method_spec, model_architecture
from eagle2.results.store import read_rows
from tests.conftest import load_each_target_once
from tests.test_runner import config
from tests.zoo_fixtures import SPECIAL_TOKENS, weight_writers, write_target

ROOT = Path(__file__).resolve().parents[1]
GPU_MODELS = gpu_models()
MAX_TRUE_WIDTH, PROXY_WIDTH = 5120, 2048  # 70B models' 8192 (~10 GB in fp32 for 1 layer + a head) do not fit
LARGE_TARGET_BYTES = 4 * 2**30  # fp32; at most one such target loaded at a time on the whole machine
DEFAULT_ZOO = ("vicuna7b",)  # in the default (fast) suite at narrow width; the rest is marked slow
QUESTION = {"question_id": 1, "category": "smoke", "turns": ["Name three colours of the rainbow."]}
NEW_TOKENS = 6


def zoo_shape(name: str, scale: str) -> tuple[int, int]:
    """(layers, width) of the zoo model for ``name`` at ``scale``."""
    if scale == "narrow":
        return 2, model_architecture(name)["num_attention_heads"] * 8
    width = model_architecture(name)["hidden_size"]
    return 1, width if width <= MAX_TRUE_WIDTH else PROXY_WIDTH


@pytest.fixture(scope="module")
def shared_target_loads():
    """The runner's ``load_target`` made to load each target once and hand the same loaded one to every later
    run of this module (the last one kept: a true-width target is gigabytes); yields that store, which
    ``zoo`` empties when it moves on to another model."""
    last: dict = {}
    with pytest.MonkeyPatch.context() as patch:
        load_each_target_once(patch, last, keep=1)
        yield last


@pytest.fixture(scope="module")
def zoo(tmp_path_factory, shared_target_loads):
    """name, scale -> (target config, results folder, common overrides), built on first use. Only the last
    (model, scale) is kept: moving on to another one first deletes the previous one's checkpoints and frees its
    loaded target (a true-width one is 5 GB in memory and 10 GB on disk at a 128k vocabulary), as does the
    module's end. Its tests run one after another (one xdist group); one asked for again is built again."""
    built = {}

    def release():
        shared_target_loads.clear()
        gc.collect()
        for root, *_ in built.values():
            shutil.rmtree(root, ignore_errors=True)
        built.clear()

    def get(name: str, scale: str):
        if (name, scale) not in built:
            release()
            root = tmp_path_factory.mktemp(f"{name}-{scale}")
            layers, width = zoo_shape(name, scale)
            target_config = llama_config(model_architecture(name), layers=layers, width=width)
            target = write_target(root / "target", target_config)
            weights = {kind: writer(root / kind, target_config) for kind, writer in weight_writers().items()}
            questions = root / "questions.jsonl"
            questions.write_text(json.dumps(QUESTION) + "\n")
            common = [f"model={name}", f"model.path={target}", "model.device=cpu", "model.dtype=float32",
                      *[f"model.{kind}={folder}" for kind, folder in weights.items()],
                      "dataset=mt_bench", f"dataset.path={questions}", f"max_new_tokens={NEW_TOKENS}",
                      f"paths.results={root / 'results'}", "logger=none", "warmup_tokens=0", "warmup_questions=0",
                      "threads=1"]
            built[name, scale] = (root, target_config, common)
        root, target_config, common = built[name, scale]
        return target_config, root / "results", common

    yield get
    release()


def decode(zoo, name: str, scale: str, method: str) -> dict:
    """The one row of ``method``'s run on the zoo model (run once; a rerun reads the stored row)."""
    _, results, common = zoo(name, scale)
    run(config(f"method={method}", *common))
    rows = [r for path in (results / "mt_bench" / name).glob(f"{method}-*.jsonl") for r in read_rows(path)]
    assert [r["status"] for r in rows] == ["ok"], rows
    return rows[0]


def check_method(zoo, name: str, scale: str, method: str) -> None:
    missing = [kind for kind in method_spec(config(f"method={method}").method).weights if kind not in weight_writers()]
    if missing:
        pytest.skip(f"drafter family {missing} names no random-checkpoint writer (its Family.fixture)")
    target_config = zoo(name, scale)[0]
    plain = decode(zoo, name, scale, "plain")
    specials = SPECIAL_TOKENS[target_config.vocab_size]
    bos = specials["<s>"] if "<s>" in specials else specials["<|begin_of_text|>"]
    assert plain["prompt_ids"][0] == bos and plain["new_tokens"] == NEW_TOKENS  # the template's BOS, real id
    if method != "plain":
        row = decode(zoo, name, scale, method)
        assert row["output_ids"] == plain["output_ids"], f"{name}/{method} differs from plain decoding"


def target_bytes(name: str, scale: str) -> int:
    """The fp32 size of the zoo target for ``name`` at ``scale`` (counted on the meta device)."""
    from transformers import LlamaForCausalLM

    layers, width = zoo_shape(name, scale)
    with torch.device("meta"):
        model = LlamaForCausalLM(llama_config(model_architecture(name), layers=layers, width=width))
    return 4 * sum(p.numel() for p in model.parameters())


def zoo_group(name: str, scale: str) -> str:
    """The xdist group of a slow zoo model: its (model, scale) (its set-up shared), or the one group of the
    large targets, which therefore run one after another on one worker."""
    return "zoo-large" if target_bytes(name, scale) > LARGE_TARGET_BYTES else f"zoo-{name}-{scale}"


def slow_group(name: str, scale: str):
    """A slow zoo model's parameter: marked slow, in its xdist group (``zoo_group``)."""
    return pytest.param(name, marks=[pytest.mark.slow, pytest.mark.xdist_group(zoo_group(name, scale))])


@pytest.mark.parametrize("method", known_methods())
@pytest.mark.parametrize("name", [n if n in DEFAULT_ZOO else slow_group(n, "narrow") for n in GPU_MODELS])
def test_zoo_narrow_proxy_every_method_equals_plain(zoo, name, method):
    check_method(zoo, name, "narrow", method)


@pytest.mark.parametrize("method", known_methods())
@pytest.mark.parametrize("name", [slow_group(n, "true") for n in GPU_MODELS])
def test_zoo_true_width_every_method_equals_plain(zoo, name, method):
    check_method(zoo, name, "true", method)


def test_zoo_covers_every_gpu_model_config():
    configs = {p.stem for p in (ROOT / "conf" / "model").glob("*.yaml")} - {"smollm2", "_base"}
    assert set(GPU_MODELS) == configs, "a GPU model config that states no architecture (its config.json facts)"
