"""Benchmark questions: the six 80-question sets shipped in ``data/benchmarks``, or any JSONL file
in the same format (``question_id``, ``category``, ``turns``), loaded through ``datasets``."""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_DIR = PROJECT_ROOT / "data" / "benchmarks"
BENCHMARKS = ("mt_bench", "humaneval", "gsm8k", "alpaca", "cnn_dm", "nq")


def benchmark_file(name: str, benchmarks_dir: str | Path | None = None) -> Path:
    folder = Path(benchmarks_dir) if benchmarks_dir else BENCHMARKS_DIR
    path = folder / name / "question.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no benchmark {name!r} at {path}; shipped ones: {', '.join(BENCHMARKS)}")
    return path


def load_questions(path: str | Path, limit: int | None = None) -> list[dict]:
    """Questions of one JSONL file, in file order, the first ``limit`` of them."""
    import datasets

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    datasets.disable_progress_bars()
    ds = datasets.load_dataset("json", data_files=str(path), split="train")
    missing = {"question_id", "turns"} - set(ds.column_names)
    if missing:
        raise ValueError(f"{path}: records need fields {sorted(missing)}")
    if limit is not None and limit >= 0:
        ds = ds.select(range(min(limit, len(ds))))
    return [{"question_id": r["question_id"], "category": r.get("category"), "turns": list(r["turns"])}
            for r in ds]


def all_benchmark_questions(benchmarks_dir: str | Path | None = None) -> set[str]:
    """Every turn of every shipped benchmark (to keep them out of training data)."""
    texts: set[str] = set()
    for name in BENCHMARKS:
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
