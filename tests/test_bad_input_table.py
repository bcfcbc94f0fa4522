"""The bad-input table, run through the real entry point in-process: each input answered in one line naming the key
or the file, before the target loads, printed alone (the run's plan line comes after the weights' and prompts'
checks), and no row written (``record_cell_failure`` stores nothing for it). Hydra's
own refusals (an unknown key without ``+``, an option a group lacks) are reduced to one line before Hydra runs
(``eagle2.bench.overrides``). And every drafter's declared setting checks (``CHECKS``) pass on its shipped YAML and
name keys its YAML has."""

from __future__ import annotations

import importlib
import zipfile

import pytest
import torch
from safetensors.torch import save_file

from eagle2.bench import runner
from eagle2.bench.overrides import override_problem
from eagle2.bench.validation import REFUSED, validate_drafter_settings
from eagle2.registry import known_methods, method_spec
from tests.test_validation import config, no_model  # noqa: F401  (no_model: a fixture failing if the target loads)


def cut_head(folder):
    """A weights folder whose safetensors header is whole but whose tensor data was cut short."""
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    save_file({"w": torch.zeros(64)}, str(folder / "model.safetensors"))
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:-40])
    return folder


def header_too_long(folder):
    """A weights folder whose safetensors header claims more bytes than the file holds."""
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes((10 ** 9).to_bytes(8, "little") + b"{}")
    return folder


def header_not_json(folder):
    """A weights folder whose safetensors header is not JSON."""
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes((20).to_bytes(8, "little") + b"{not json at all....." + bytes(50))
    return folder


def text_file(text):
    """A maker writing ``text`` into the file it is given (question files)."""
    def make(path):
        path.write_text(text)
        return path
    return make


def garbage_datastore(path):
    path.write_bytes(b"\x93NUMPY not a zip at all" * 10)
    return path


def cut_datastore(path):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("tokens.npy", b"x" * 1000)
    path.write_bytes(path.read_bytes()[:500])
    return path


TABLE = [  # (overrides, a file to make: (name, maker) or None, what the one line must say)
    (["method=lookahead", "method.window=0"], None, "method.window=0 is invalid: must be an integer >= 2 "
                                                    "(conf/method/lookahead.yaml)"),
    (["method=rest", "method.min_span=5", "method.max_span=3"], None, "method.max_span=3 is invalid"),
    (["method=suffix", "method.alpha=0"], None, "method.alpha=0 is invalid: must be a number > 0"),
    (["method=token_recycling", "method.top_k=2"], None, "method.top_k=2 is invalid"),
    (["method=samd", "method.max_depth=1"], None, "method.max_depth=1 is invalid: must be an integer >= 2"),
    (["model.dtype=int4"], None, "model.dtype='int4' is invalid: must be auto or one of"),
    (["engine.compile=maybe"], None, "engine.compile='maybe' is invalid: must be auto or true or false"),
    (["dataset.path={tmp}"], None, "is a folder; give the question .jsonl file in it"),
    (["method=eagle2", "model.head={file}"], ("head", cut_head), "model.head: {file}/model.safetensors is not a whole "
                                                                 "safetensors file (its tensors need"),
    (["method=rest", "model.rest_datastore={file}"], ("store.npz", garbage_datastore),
     "model.rest_datastore={file} is not a whole REST datastore"),
    (["method=rest", "model.rest_datastore={file}"], ("store.npz", cut_datastore),
     "model.rest_datastore={file} is not a whole REST datastore"),
    # each drafter's settings (its CHECKS, conf/method/<name>.yaml)
    (["method=peagle", "method.depth=0"], None, "method.depth=0 is invalid: must be an integer >= 1"),
    (["method=peagle", "method.choice_tree=[[0,0]]"], None, "method.choice_tree=[[0, 0]] is invalid: must be null"),
    (["method=dflash", "method.block_size=1"], None, "method.block_size=1 is invalid: must be null (the draft "
                                                      "model's own) or an integer >= 2 (conf/method/dflash.yaml)"),
    (["method=pard", "method.total_tokens=many"], None, "method.total_tokens='many' is invalid: must be an integer "
                                                        ">= 1 or auto"),
    (["method=hass", "method.top_k=0"], None, "method.top_k=0 is invalid: must be an integer >= 1"),
    (["method=sps", "method.k=0"], None, "method.k=0 is invalid: must be an integer >= 1"),
    (["method=medusa", "method.choices=[[0,0]]"], None, "method.choices=[[0, 0]] is invalid: method.choices has "
                                                        "paths whose parent path is absent"),
    (["method=pld", "method.min_ngram=3", "method.max_ngram=2"], None, "method.min_ngram=3 is invalid: must be <= "
                                                                       "method.max_ngram (2)"),
    (["method=oracle", "method.depth=0"], None, "method.depth=0 is invalid: must be an integer >= 1"),
    # drafter weights: damaged, missing, a file for a folder
    (["method=dflash", "model.dflash_head={file}"], ("dflash", header_too_long),
     "model.dflash_head: {file}/model.safetensors is not a whole safetensors file (header length 1000000000"),
    (["method=peagle", "model.peagle_head={file}"], ("peagle", header_not_json),
     "model.peagle_head: {file}/model.safetensors is not a whole safetensors file"),
    (["method=pard", "model.pard_draft={tmp}/nosuch"], None, "/nosuch: no such folder"),
    (["method=hass", "model.hass_head={file}"], ("h.safetensors", text_file("x")),
     "model.hass_head={file} is a file; give the folder that holds config.json and model.safetensors"),
    # question files, prompt lengths, keys and run settings
    (["dataset.path={file}"], ("q.jsonl", text_file("{not json\n")), "{file} line 1: not valid JSON"),
    (["dataset.path={file}"], ("q.jsonl", text_file('{"question_id": 1}\n')), "{file} line 1: missing turns"),
    (["dataset.path={file}"], ("q.jsonl", text_file("")), "{file}: no questions (the file is empty"),
    (["dataset.path={tmp}/missing.jsonl"], None, "/missing.jsonl does not exist (dataset.path / dataset=mt_bench)"),
    (["dataset.path={file}", "model.max_context=128", "max_new_tokens=4"],
     ("q.jsonl", text_file('{"question_id": 1, "turns": ["%s"]}\n' % ("word " * 400))),
     "question 1 turn 0: prompt has 431 tokens but the context of 128 leaves room for 124"),
    (["+dataset.limt=3"], None, "unknown key dataset.limt: no config under conf/ has it"),
    (["temperature=-1"], None, "temperature=-1 is invalid: must be a number >= 0 (0 = greedy)"),
]


@pytest.mark.parametrize("overrides, make, line", TABLE, ids=[" ".join(o) for o, _, _ in TABLE])
@pytest.mark.usefixtures("no_model")
def test_a_bad_input_is_one_line_before_the_target_loads_and_writes_no_row(overrides, make, line, tmp_path, capsys):
    file = make[1](tmp_path / make[0]) if make else None
    given = [o.format(tmp=tmp_path, file=file) for o in overrides]
    cfg = config(*given, "dataset.limit=1", f"paths.results={tmp_path / 'r'}")
    with pytest.raises(REFUSED) as err:
        runner.run(cfg)
    text = str(err.value)
    assert "[eagle2]" not in capsys.readouterr().out  # the refusal is the run's only line (no plan line before it)
    print(f"{' '.join(given)} -> {text}")
    assert "\n" not in text and line.format(file=file) in text
    assert runner.record_cell_failure(cfg, err.value).startswith("nowhere")
    assert not list((tmp_path / "r").rglob("*.jsonl"))


@pytest.mark.parametrize("config_name, argv, line", [
    ("config", ["method.bogus=2"], "unknown key method.bogus: the config as composed has no such key; "),
    ("config", ["method.bogus=2"], "to add it anyway write +method.bogus=2"),
    ("config", ["metod.k=2"], "did you mean method.k"),
    ("config", ["method=nosuch"], "Could not find 'method/nosuch'; the options are "),
    ("config", ["model=nosuch"], "Could not find 'model/nosuch'; the options are "),
    ("config", ["dataset=nosuch"], "Could not find 'dataset/nosuch'; the options are alpaca, cnn_dm"),
    ("config", ["experiment=nosuch"], "Could not find 'experiment/nosuch'; the options are "),
    ("train_head", ["head.resume_dirr=x"], "unknown key head.resume_dirr"),
    ("config", ["method.k=[1,"], "cannot parse an override: "),
])
def test_hydra_refusals_are_one_line(config_name, argv, line):
    problem = override_problem(config_name, argv)
    assert "\n" not in problem and line in problem and "HYDRA_FULL_ERROR" not in problem


def test_good_overrides_and_sweeps_pass_the_override_check():
    assert override_problem("config", ["method=lookahead", "method.window=3", "+method.extra=1"]) is None
    assert override_problem("config", ["-m", "method=eagle2,samd", "dataset.limit=2"]) is None


@pytest.mark.parametrize("name", known_methods())
def test_every_drafter_checks_pass_on_its_yaml_and_name_its_keys(name):
    cfg = config(f"method={name}").method
    validate_drafter_settings(cfg)
    module = importlib.import_module(method_spec(cfg).drafter.rpartition(".")[0])
    assert set(getattr(module, "CHECKS", {})) <= set(cfg), name
