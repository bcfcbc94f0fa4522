"""The EAGLE head's draft vocabulary against the target's held-out answers, and its extension by a corpus.

A head drafts over the first ``method.draft_vocab_size`` ids of its ``draft_vocab.safetensors`` (target
token ids, most frequent in its training answers first); a token outside is never drafted, which caps
acceptance but never changes the output. This prints, for each size, the share of the held-out answer
tokens (the target's greedy answers to MT-bench first turns, ``train.eval.mtbench``) that each
vocabulary covers: the head's own, the corpus's (its answer tokens by frequency), and the head's extended
by the corpus's tokens it lacks (appended in the corpus's order, so every prefix the head drafted over
before stays as it was). ``--write`` stores the extended one in the head folder.

    python -m experiments.research.draft_vocab                  # the table (shipped EAGLE head, the conversations)
    python -m experiments.research.draft_vocab --write          # ... and extend the head's draft vocabulary

The held-out folder is built by the recipe's eval stage (``python train_head.py stage=eval``); the corpus
by ``python train_head.py stage=features``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from eagle2.heads.checkpoint import read_token_ids, write_token_ids
from eagle2.heads.eagle_head import DRAFT_VOCAB_FILE
from eagle2.training.data import answer_token_counts, tokens_by_frequency

SIZES = (4096, 8192, 12288, 16384)


def extended(base: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
    """``base`` followed by the ids of ``extra`` it lacks, in ``extra``'s order."""
    return torch.cat([base, extra[~torch.isin(extra, base)]])


def coverage(ids: torch.Tensor, counts: torch.Tensor) -> float:
    """The share of the counted tokens that ``ids`` holds."""
    ids = ids[ids < len(counts)]
    return float(counts[ids].sum() / counts.sum())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", type=Path, default=Path("artifacts/smollm2/eagle_head"))
    ap.add_argument("--corpus", type=Path, default=Path("artifacts/work/smollm2/conversations_corpus"))
    ap.add_argument("--heldout", type=Path, default=Path("artifacts/work/smollm2/mtbench_heldout"))
    ap.add_argument("--write", action="store_true", help="store the extended vocabulary in --head")
    args = ap.parse_args(argv)
    for folder, how in ((args.heldout, "python train_head.py stage=eval"),
                        (args.corpus, "python train_head.py stage=features")):
        if not any(folder.glob("shard_*.safetensors")):
            raise SystemExit(f"no corpus shards in {folder}: build them with `{how}`")
    head = read_token_ids(args.head / DRAFT_VOCAB_FILE)
    corpus = tokens_by_frequency(args.corpus, limit=1 << 20)
    longer = extended(head, corpus)
    counts = answer_token_counts(args.heldout).double()
    vocabs = {f"head ({len(head)})": head, f"corpus ({len(corpus)})": corpus, f"head + corpus ({len(longer)})": longer}
    print(f"Held-out answer tokens covered ({int(counts.sum())} positions of {args.heldout}):")
    print("| size | " + " | ".join(vocabs) + " |")
    print("|---|" + "---|" * len(vocabs))
    for size in SIZES:
        print(f"| {size} | " + " | ".join(f"{coverage(v[:size], counts):.4f}" for v in vocabs.values()) + " |")
    if args.write:
        write_token_ids(longer, args.head / DRAFT_VOCAB_FILE)
        print(f"wrote {len(longer)} ids to {args.head / DRAFT_VOCAB_FILE}")


if __name__ == "__main__":
    main()
