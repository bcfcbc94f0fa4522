"""Benchmark loading through `datasets`, chat templates, and the training prompt filter."""

from __future__ import annotations

import json

import pytest

from eagle2.bench.validation import QuestionFileError
from eagle2.prompts.chat import render
from eagle2.prompts.questions import PROJECT_ROOT, all_benchmark_questions, benchmark_file, load_questions
from eagle2.registry import known_benchmarks
from eagle2.training.corpora.prompts import training_records


@pytest.mark.parametrize("name", known_benchmarks())
def test_shipped_benchmarks_have_80_questions(name):
    qs = load_questions(benchmark_file(name))
    assert len(qs) == 80
    assert all(q["turns"] and isinstance(q["turns"][0], str) for q in qs)
    assert {len(q["turns"]) for q in qs} == ({2} if name == "mt_bench" else {1})


def test_limit_and_custom_jsonl(tmp_path):
    assert [q["question_id"] for q in load_questions(benchmark_file("gsm8k"), 3)] == [
        q["question_id"] for q in load_questions(benchmark_file("gsm8k"))[:3]]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps({"question_id": i, "turns": [f"q{i}"]}) for i in range(4)))
    assert [q["turns"] for q in load_questions(path, 2)] == [["q0"], ["q1"]]
    with pytest.raises(FileNotFoundError):
        load_questions(tmp_path / "missing.jsonl")
    assert load_questions(path, 0) == []
    with pytest.raises(ValueError, match=r"dataset.limit=-1 is invalid: must be null \(all questions\) or an int"):
        load_questions(path, -1)


def test_malformed_jsonl_names_its_line_not_a_datasets_error(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"question_id": 1, "turns": ["a"]}\n\n{"question_id": 2, "turns": ["b"]\n')
    with pytest.raises(QuestionFileError, match=r"x.jsonl line 3: not valid JSON \(Expecting ',' delimiter"):
        load_questions(path)
    path.write_text("")
    with pytest.raises(QuestionFileError, match=r"x.jsonl: no questions \(the file is empty"):
        load_questions(path)


def test_training_prompts_exclude_every_benchmark_question():
    prompts = [p for p, _ in training_records(PROJECT_ROOT / "data" / "train" / "alpaca_5000.json.gz")]
    held_out = all_benchmark_questions()
    assert 4900 < len(prompts) < 5000
    assert not held_out & set(prompts)


def test_chat_templates():
    v = render("vicuna", ["Hi", "More"], ["Hello"], None)
    assert v.startswith("A chat between") and "USER: Hi ASSISTANT: Hello</s>USER: More ASSISTANT:" in v
    l2 = render("llama2", ["Hi"], [], "Be nice")
    assert l2 == "[INST] <<SYS>>\nBe nice\n<</SYS>>\n\nHi [/INST] "
    l3 = render("llama3", ["Hi"], [], None)
    assert l3.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n") and "user<|end_header_id|>\n\nHi" in l3


def test_training_files_ship_gzip_compressed_and_read_as_plain(tmp_path):
    """data/train ships ``.json.gz`` / ``.jsonl.gz``; a compressed file reads as its plain text does, and a
    plain name whose file exists only compressed (an older config's value) reads the compressed file."""
    import gzip

    from eagle2.training.corpora.prompts import training_records

    train = PROJECT_ROOT / "data" / "train"
    assert sorted(p.name for p in train.iterdir()) == ["alpaca_5000.json.gz", "code_alpaca_2k.json.gz",
                                                       "gsm8k_train.jsonl.gz"]
    lines = tmp_path / "g.jsonl"
    lines.write_bytes(gzip.decompress((train / "gsm8k_train.jsonl.gz").read_bytes()))
    plain = training_records(lines)
    assert len(plain) > 7000
    assert training_records(train / "gsm8k_train.jsonl.gz") == plain
    assert training_records(train / "gsm8k_train.jsonl") == plain  # the old name
