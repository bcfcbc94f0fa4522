"""REST datastores (``eagle2.heads.rest_datastore``) from a corpus of this layer; ``python -m
experiments.ops.build_datastore`` builds and caches them under ``artifacts/work/rest/`` (it loads the model's
tokenizer, which this layer does not). The default chat corpus, the ShareGPT export's messages, is the harness's
(``eagle2.bench.first_use``: method=rest builds it on first use).

``chat_entries`` takes whole conversations from token shards (``eagle2.training.shards``; ``--shards`` names the
folders, e.g. ``artifacts/corpus/smollm2_conversations``, the shipped corpus); ``code`` takes each record's
instruction (with its input) and its answer as two entries, as the authors add each message of a
conversation. Benchmark questions are not in either (the token shards drop them; Code Alpaca shares
none).
"""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from eagle2.heads.rest_datastore import Datastore
from eagle2.prompts.questions import PROJECT_ROOT

SHIPPED_SHARDS = PROJECT_ROOT / "artifacts/corpus/smollm2_conversations"
CODE_RECORDS = PROJECT_ROOT / "data/train/code_alpaca_2k.json.gz"


def default_out(model: str, corpus: str) -> Path:
    return PROJECT_ROOT / "artifacts/work/rest" / f"{model}-{corpus}.npz"


def chat_entries(folders: list[Path]):
    """Every conversation's token ids in the token shards of ``folders``."""
    from eagle2.training.shards import read_token_shard, token_shard_paths

    paths = [p for folder in folders for p in token_shard_paths(folder)]
    if not paths:
        raise SystemExit(f"no token shards (tokens_*.npz) in {', '.join(map(str, folders))}")
    for path in tqdm(paths, desc="datastore: reading shards"):
        for ids, _ in read_token_shard(path)[0]:
            yield ids


def code_entries(tokenizer, path: Path = CODE_RECORDS):
    """Each Code Alpaca record's instruction (+ input) and answer, tokenized without special tokens (any
    benchmark question dropped, ``eagle2.training.corpora.prompts.training_records``)."""
    from eagle2.training.corpora.prompts import training_records

    for prompt, answer in tqdm(training_records(path), desc="datastore: tokenizing code"):
        for text in (prompt, answer):
            yield tokenizer.encode(text, add_special_tokens=False)


def build_datastore(entries, out: Path, depth: int = 16) -> Path:
    entries = list(entries)
    print(f"[datastore] sorting the suffixes of {len(entries):,} entries ...", flush=True)
    store = Datastore.from_entries(entries, depth)
    store.save(out)
    print(f"[datastore] {len(store):,} tokens -> {out}", flush=True)
    return out
