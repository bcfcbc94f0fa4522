"""Build a REST datastore (``eagle2.drafters.retrieval``) from a corpus, cached under ``artifacts/work/rest/``:

    python -m eagle2.training.datastore --corpus chat   # token shards: ShareGPT's if built, else the shipped corpus
    python -m eagle2.training.datastore --corpus code   # data/train/code_alpaca_2k.json.gz, the model's tokenizer

``chat`` takes whole conversations from token shards (``eagle2.training.token_shards``; ``--shards`` names
the folders, default ``artifacts/work/sharegpt/tokens`` (``train_head.py train=sharegpt stage=sharegpt``)
when it exists, else ``artifacts/corpus/smollm2_conversations``); ``code`` takes each record's
instruction (with its input) and its answer as two entries, as the authors add each message of a
conversation. Benchmark questions are not in either (the ShareGPT shards drop them; Code Alpaca shares
none). An existing datastore is kept unless ``--rebuild``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tqdm import tqdm

from eagle2.drafters.retrieval import Datastore
from eagle2.prompts.questions import PROJECT_ROOT

SHAREGPT_SHARDS = PROJECT_ROOT / "artifacts/work/sharegpt/tokens"
SHIPPED_SHARDS = PROJECT_ROOT / "artifacts/corpus/smollm2_conversations"
CODE_RECORDS = PROJECT_ROOT / "data/train/code_alpaca_2k.json.gz"


def default_out(model: str, corpus: str) -> Path:
    return PROJECT_ROOT / "artifacts/work/rest" / f"{model}-{corpus}.npz"


def chat_entries(folders: list[Path]):
    """Every conversation's token ids in the token shards of ``folders``."""
    from eagle2.training.token_shards import read_token_shard, token_shard_paths

    paths = [p for folder in folders for p in token_shard_paths(folder)]
    if not paths:
        raise SystemExit(f"no token shards (tokens_*.npz) in {', '.join(map(str, folders))}")
    for path in tqdm(paths, desc="datastore: reading shards"):
        for ids, _ in read_token_shard(path)[0]:
            yield ids


def code_entries(tokenizer, path: Path = CODE_RECORDS):
    """Each Code Alpaca record's instruction (+ input) and answer, tokenized without special tokens (any
    benchmark question dropped, ``eagle2.training.corpus.training_records``)."""
    from eagle2.training.corpus import training_records

    for prompt, answer in tqdm(training_records(path), desc="datastore: tokenizing code"):
        for text in (prompt, answer):
            yield tokenizer.encode(text, add_special_tokens=False)


def model_tokenizer(model: str):
    from hydra import compose, initialize_config_dir
    from transformers import AutoTokenizer

    from eagle2.bench.models import load_pretrained, weights_location

    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model={model}"])
    return load_pretrained(AutoTokenizer, weights_location(cfg.model))


def build_datastore(entries, out: Path, depth: int = 16) -> Path:
    entries = list(entries)
    print(f"[datastore] sorting the suffixes of {len(entries):,} entries ...", flush=True)
    store = Datastore.from_entries(entries, depth)
    store.save(out)
    print(f"[datastore] {len(store):,} tokens -> {out}", flush=True)
    return out


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", choices=("chat", "code"), required=True)
    parser.add_argument("--model", default="smollm2", help="its tokenizer (code) and the default file name")
    parser.add_argument("--shards", action="append", type=Path, help="token-shard folder(s) for --corpus chat")
    parser.add_argument("--out", type=Path, help="default: artifacts/work/rest/<model>-<corpus>.npz")
    parser.add_argument("--depth", type=int, default=16, help="longest query (REST's max_span)")
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args(argv)
    out = args.out or default_out(args.model, args.corpus)
    if out.is_file() and not args.rebuild:
        print(f"[datastore] {out} exists (--rebuild to build it again)")
        return out
    if args.corpus == "chat":
        folders = args.shards or [SHAREGPT_SHARDS if SHAREGPT_SHARDS.is_dir() else SHIPPED_SHARDS]
        return build_datastore(chat_entries(folders), out, args.depth)
    return build_datastore(code_entries(model_tokenizer(args.model)), out, args.depth)


if __name__ == "__main__":
    main()
