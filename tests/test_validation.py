"""Bad config values and bad question files: one clear error naming the key (and its valid range) or
the file and line, raised by ``run`` before any model loads. No model is loaded here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from eagle2.bench import runner
from eagle2.bench.validation import ConfigError, validate_run_config
from eagle2.prompts.questions import QuestionFileError, check_question_file, load_questions

ROOT = Path(__file__).resolve().parents[1]


def config(*overrides):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=["logger=none", "method=plain", *overrides])


@pytest.fixture
def no_model(monkeypatch):
    """Fail loudly if anything tries to load a model (the runner's import of the loader, and the loader where
    ``train_head.py`` imports it from when it runs)."""
    from eagle2.bench import models

    def refuse(*_args, **_kw):
        raise AssertionError("a model was loaded before the config was checked")

    monkeypatch.setattr(runner, "load_target", refuse)
    monkeypatch.setattr(models, "load_target", refuse)


BAD_VALUES = [
    ("max_new_tokens=0", "max_new_tokens=0 is invalid: must be an integer >= 1"),
    ("max_new_tokens=-5", "max_new_tokens=-5 is invalid: must be an integer >= 1"),
    ("threads=0", "threads=0 is invalid: must be null (torch's default) or an integer >= 1"),
    ("threads=-2", "threads=-2 is invalid"),
    ("dataset.limit=-1", "dataset.limit=-1 is invalid: must be null (all questions) or an integer >= 0"),
    ("temperature=-0.5", "temperature=-0.5 is invalid: must be a number >= 0 (0 = greedy)"),
    ("top_p=0", "top_p=0 is invalid: must be a number in (0, 1] (1 = off)"),
    ("top_p=1.5", "top_p=1.5 is invalid: must be a number in (0, 1]"),
    ("top_p=-0.1", "top_p=-0.1 is invalid"),
    ("top_k=-1", "top_k=-1 is invalid: must be an integer >= 0 (0 = off)"),
    ("seed=abc", "seed='abc' is invalid: must be an integer"),
    ("seed=1.5", "seed=1.5 is invalid: must be an integer"),
    ("warmup_tokens=-1", "warmup_tokens=-1 is invalid: must be null (no warm-up) or an integer >= 0"),
    ("model.kernels=fastest", "model.kernels='fastest' is invalid: must be auto or packed or stock"),
]


@pytest.mark.parametrize("override, message", BAD_VALUES)
def test_bad_value_is_one_clear_error_before_any_model_loads(override, message, tmp_path, no_model):
    cfg = config(override, f"paths.results={tmp_path}")
    with pytest.raises(ConfigError) as err:
        validate_run_config(cfg)
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=message.split(" is invalid")[0]):
        runner.run(cfg)  # the same error from run, before the model (or the results store)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("override", ["max_new_tokens=1", "threads=1", "threads=null", "dataset.limit=0",
                                      "temperature=0", "temperature=1.3", "top_p=1", "top_p=0.01", "top_k=0",
                                      "top_k=50", "seed=-3", "warmup_tokens=0", "warmup_tokens=null",
                                      "model.kernels=stock", "model.kernels=packed"])
def test_edge_values_that_are_valid_pass(override):
    validate_run_config(config(override))


@pytest.mark.parametrize("dataset", ["mt_bench", "humaneval", "gsm8k", "alpaca", "cnn_dm", "nq"])
def test_shipped_configs_pass(dataset):
    validate_run_config(config(f"dataset={dataset}"))


def _jsonl(tmp_path, *lines: str) -> Path:
    path = tmp_path / "x.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


GOOD = json.dumps({"question_id": 1, "turns": ["hi"]})

BAD_FILES = [
    ((), r"x.jsonl: no questions \(the file is empty"),
    (("", "   "), r"x.jsonl: no questions"),
    ((GOOD, json.dumps({"question_id": 2, "turns": ["a"]}), '{"question_id": 3, "turns": ["a"'),
     r"x.jsonl line 3: not valid JSON \(Expecting .* at column \d+\)"),
    ((GOOD, "[1, 2]"), r"x.jsonl line 2: expected a JSON object with question_id and turns, got list"),
    (('{"turns": ["a"]}',), r"x.jsonl line 1: missing question_id \(each line needs"),
    (('{"id": 1}',), r"x.jsonl line 1: missing question_id and turns"),
    (('{"question_id": 1, "turns": []}',), r"x.jsonl line 1: turns must be a non-empty list of strings, got \[\]"),
    (('{"question_id": 1, "turns": "hello"}',), r"x.jsonl line 1: turns must be a non-empty list of strings"),
    (('{"question_id": 1, "turns": ["a", 2]}',), r"x.jsonl line 1: turns must be a non-empty list of strings"),
    (('{"question_id": null, "turns": ["a"]}',), r"x.jsonl line 1: question_id must be an integer or a string"),
    ((GOOD, GOOD), r"x.jsonl line 2: question_id 1 repeats line 1"),
    ((GOOD, '{"question_id": "b", "turns": ["a"]}'),
     r"x.jsonl line 2: question_id 'b' is a str but line 1's is a int"),
]


@pytest.mark.parametrize("lines, message", BAD_FILES)
def test_bad_question_file_names_file_and_line(lines, message, tmp_path, no_model):
    path = _jsonl(tmp_path, *lines)
    with pytest.raises(QuestionFileError, match=message) as err:
        check_question_file(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(QuestionFileError, match=message):
        load_questions(path)  # before datasets gets to fail obscurely
    with pytest.raises(QuestionFileError, match=message):
        runner.run(config(f"dataset.path={path}", f"paths.results={tmp_path / 'r'}"))
    assert not (tmp_path / "r").exists()


def test_good_file_with_blank_lines_is_counted(tmp_path):
    path = _jsonl(tmp_path, GOOD, "", json.dumps({"question_id": 2, "turns": ["a", "b"], "category": "x"}))
    assert check_question_file(path) == 2


def test_not_utf8_and_missing_file(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"question_id": 1, "turns": ["\xff"]}\n')
    with pytest.raises(QuestionFileError, match="x.jsonl: not UTF-8 text"):
        check_question_file(path)
    with pytest.raises(ConfigError, match="missing.jsonl does not exist"):
        validate_run_config(config(f"dataset.path={tmp_path / 'missing.jsonl'}"))


METHOD_BAD_VALUES = [
    (["method=eagle2", "method.total_tokens=0"], "method.total_tokens=0 is invalid: must be an integer >= 1 or auto"),
    (["method=eagle2", "method.total_tokens=many"], "method.total_tokens='many' is invalid"),
    (["method=eagle3", "method.depth=0"], "method.depth=0 is invalid: must be an integer >= 1"),
    (["method=eagle2", "method.top_k=-1"], "method.top_k=-1 is invalid"),
    (["method=eagle2", "method.total_tokens=auto", "method.max_total_tokens=0"], "method.max_total_tokens=0"),
    (["method=eagle2", "method.lookup_branch=true", "method.lookup_k=0"], "method.lookup_k=0 is invalid"),
    (["method=eagle", "method.draft_vocab_size=0"], "method.draft_vocab_size=0 is invalid"),
    (["method=pld", "method.k=0"], "method.k=0 is invalid: must be an integer >= 1"),
    (["method=pld", "method.branches=0"], "method.branches=0 is invalid"),
    (["method=pld", "method.min_ngram=3", "method.max_ngram=2"], "method.min_ngram=3 is invalid: must be <= "
                                                                  "method.max_ngram (2)"),
    (["method=sps", "method.k=0"], "method.k=0 is invalid"),
    (["method=sps", "method.draft_temperature=-1"], "method.draft_temperature=-1 is invalid"),
    (["method=oracle", "method.depth=0"], "method.depth=0 is invalid"),
    (["method=medusa", "method.choices=[]"], "method.choices=[] is invalid"),
    (["method=eagle", "method.choices=[[0],[0,0,0]]"], "parent path is absent"),
    (["method=eagle2", "method.draft_lm_head_dtype=bf15"], "method.draft_lm_head_dtype='bf15' is invalid"),
    (["method=plain", "batch_size=0"], "batch_size=0 is invalid: must be an integer >= 1"),
    (["method=plain", "batch_size=-1"], "batch_size=-1 is invalid"),
]


@pytest.mark.parametrize("overrides, message", METHOD_BAD_VALUES, ids=lambda v: " ".join(v) if isinstance(v, list)
                         else None)
def test_bad_method_value_is_refused_before_any_model_loads(overrides, message, tmp_path, no_model):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["logger=none", f"paths.results={tmp_path}", *overrides])
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        runner.run(cfg)
    assert "\n" not in str(err.value)
    assert runner.record_cell_failure(cfg, err.value).startswith("nowhere: the config was refused")
    assert not any(tmp_path.iterdir())  # nothing stored, so nothing filed with another config's rows


@pytest.mark.parametrize("method", ["plain", "eagle", "eagle2", "eagle3", "medusa", "sps", "pld", "oracle"])
def test_every_shipped_method_passes(method):
    validate_run_config(config(f"method={method}"))


def test_a_missing_dataset_file_is_refused_and_filed_nowhere(tmp_path, no_model):
    cfg = config(f"dataset.path={tmp_path / 'missing.jsonl'}", f"paths.results={tmp_path}")
    with pytest.raises(ConfigError, match="missing.jsonl does not exist") as err:
        runner.run(cfg)
    assert runner.record_cell_failure(cfg, err.value).startswith("nowhere")
    assert not (tmp_path / "mt_bench").exists()
