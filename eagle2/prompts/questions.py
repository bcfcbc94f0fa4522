"""Benchmark questions: the sets shipped in ``data/benchmarks`` (one per ``conf/dataset`` YAML), or any JSONL file
in the same format (``question_id``, ``category``, ``turns``), read with the standard library (a GPU node
without ``datasets`` runs them); only a hub dataset (``dataset.hub``) needs ``datasets``."""

from __future__ import annotations

import json
from pathlib import Path

from eagle2.registry import known_benchmarks

PROJECT_ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS_DIR = PROJECT_ROOT / "data" / "benchmarks"


def benchmark_file(name: str, benchmarks_dir: str | Path | None = None) -> Path:
    folder = Path(benchmarks_dir) if benchmarks_dir else BENCHMARKS_DIR
    path = folder / name / "question.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no benchmark {name!r} at {path}; shipped ones: {', '.join(known_benchmarks())}")
    return path


class QuestionFileError(ValueError):
    """A question file that cannot be used, named with its path and, where it applies, its line."""


def check_question_file(path: str | Path) -> int:
    """Check a question JSONL (``read_question_file``); return the number of questions."""
    return len(read_question_file(path))


def read_question_file(path: str | Path) -> list[dict]:
    """Read and check a question JSONL: one JSON object a line, each with a
    ``question_id`` (an int or a string, one type for the whole file, no repeats) and ``turns``, a
    non-empty list of strings. Raise one clear ``QuestionFileError`` naming the file and line;
    return the records, in file order."""
    path = Path(path)
    if path.is_dir():
        raise FileNotFoundError(f"dataset file {path} is a folder; give the question .jsonl file in it"
                                + (f" ({path / 'question.jsonl'}?)" if (path / "question.jsonl").is_file() else ""))
    if not path.is_file():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise QuestionFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    seen: dict = {}  # question_id -> line
    records = []
    id_type = None  # (type, line) of the first question_id
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise QuestionFileError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(record, dict):
            raise QuestionFileError(f"{where}: expected a JSON object with question_id and turns, "
                                    f"got {type(record).__name__}")
        missing = [key for key in ("question_id", "turns") if key not in record]
        if missing:
            raise QuestionFileError(f"{where}: missing {' and '.join(missing)} (each line needs question_id "
                                    "and turns, a non-empty list of strings)")
        qid, turns = record["question_id"], record["turns"]
        if isinstance(qid, bool) or not isinstance(qid, (int, str)):
            raise QuestionFileError(f"{where}: question_id must be an integer or a string, got {qid!r}")
        if id_type is None:
            id_type = (type(qid), number)
        elif type(qid) is not id_type[0]:
            raise QuestionFileError(f"{where}: question_id {qid!r} is a {type(qid).__name__} but line "
                                    f"{id_type[1]}'s is a {id_type[0].__name__}; use one type for the file")
        if qid in seen:
            raise QuestionFileError(f"{where}: question_id {qid!r} repeats line {seen[qid]}")
        seen[qid] = number
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise QuestionFileError(f"{where}: turns must be a non-empty list of strings, got {turns!r:.80}")
        records.append(record)
    if not seen:
        raise QuestionFileError(f"{path}: no questions (the file is empty; "
                                "expected one JSON object a line with question_id and turns)")
    return records


def load_questions(path: str | Path, limit: int | None = None) -> list[dict]:
    """Questions of one JSONL file, in file order, the first ``limit`` of them.

    The file is checked line by line as it is read (``check_question_file``): a bad file gives one
    clear error naming its line."""
    path = Path(path)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"dataset.limit={limit!r} is invalid: must be null (all questions) or an integer >= 0")
    records = read_question_file(path)
    if limit is not None:
        records = records[:limit]
    return [{"question_id": r["question_id"], "category": r.get("category"), "turns": list(r["turns"])}
            for r in records]


def all_benchmark_questions(benchmarks_dir: str | Path | None = None) -> set[str]:
    """Every turn of every registered benchmark (to keep them out of training data); a registered
    benchmark without its shipped file is an error, never skipped."""
    texts: set[str] = set()
    for name in known_benchmarks():
        for q in load_questions(benchmark_file(name, benchmarks_dir)):
            texts.update(t.strip() for t in q["turns"])
    return texts


def load_hub_questions(hub_cfg, limit: int | None = None) -> list[dict]:
    """Questions from a hub dataset (``hub: {path, split, question_field, name}``); needs hub access."""
    import datasets

    try:
        ds = datasets.load_dataset(hub_cfg["path"], hub_cfg.get("name"), split=hub_cfg.get("split", "test"))
    except Exception as exc:  # noqa: BLE001 - one clear line instead of a stack of retries
        raise RuntimeError(f"cannot load hub dataset {hub_cfg['path']!r} ({type(exc).__name__}); "
                           "use the shipped questions (dataset.hub=null) or dataset.path=file.jsonl") from None
    if limit is not None and limit >= 0:
        ds = ds.select(range(min(limit, len(ds))))
    field = hub_cfg.get("question_field", "question")
    return [{"question_id": i, "category": None, "turns": [r[field]]} for i, r in enumerate(ds)]
