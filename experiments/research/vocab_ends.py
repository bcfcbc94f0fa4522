"""How often a head's draft vocabulary ends an accepted chain, read from decoded result rows.

Each verification round ends on a token the target chose itself (the correction after the accepted drafts, or
the bonus token after a fully accepted branch). When that token lies outside the drafting head's vocabulary,
no draft could have matched it: the vocabulary, not the head's skill, ended the round. This counts those
rounds per method, beside the share of all output tokens outside the vocabulary, from the rows' own
``output_ids`` and ``accept_lengths``; each head folder is checked against the rows' weights digest.

    python -m experiments.research.vocab_ends RESULTS --head eagle3_head=artifacts/smollm2/eagle3_head \
        --head head=artifacts/smollm2/eagle_head

An EAGLE-3 head drafts over its ``d2t`` tokens; an EAGLE head over the first ``method.draft_vocab_size`` tokens
of its ``draft_vocab.safetensors`` (all tokens when unset).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from safetensors import safe_open

from eagle2.heads.checkpoint import read_token_ids, weights_fingerprint
from eagle2.heads.eagle_head import DRAFT_VOCAB_FILE
from eagle2.results.frames import load_rows


def round_endings(output_ids: list[int], accept_lengths: list[int]) -> list[int]:
    """The token each round ended on: the last of the tokens it emitted. A last round cut by the token cap
    or the end of the answer (its tokens not all in ``output_ids``) ended on no choice of the target's: left out."""
    ends, at = [], 0
    for emitted in accept_lengths:
        at += emitted
        if at > len(output_ids):
            break
        if emitted:
            ends.append(output_ids[at - 1])
    return ends


def outside(tokens: list[int], vocab: set[int] | None) -> int:
    """How many of ``tokens`` lie outside ``vocab`` (None: the full vocabulary, none)."""
    return 0 if vocab is None else sum(t not in vocab for t in tokens)


def head_vocabulary(folder: Path, method_config: dict) -> set[int] | None:
    """The target tokens ``folder``'s head drafts over under ``method_config`` (None: every token)."""
    weights = folder / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        if "d2t" in f.keys():  # an EAGLE-3 head: its own draft vocabulary
            d2t = f.get_tensor("d2t")
            return set((d2t + torch.arange(len(d2t))).tolist())
    size = method_config.get("draft_vocab_size")
    if not size or not (folder / DRAFT_VOCAB_FILE).is_file():
        return None
    return set(read_token_ids(folder / DRAFT_VOCAB_FILE)[: int(size)].tolist())


def vocab_end_table(rows, heads: dict[str, Path]) -> str:
    """Per method whose drafter weights are among ``heads`` (weights key -> folder): rounds, tau, and the shares
    of rounds ending, and of output tokens lying, outside the head's vocabulary."""
    lines = ["| method | head | turns | rounds | pooled tau | rounds ending outside the vocabulary | "
             "output tokens outside |", "|---|---|---:|---:|---:|---:|---:|"]
    for method, group in rows.groupby("method", sort=False):
        weights = group.iloc[0]["weights"] or {}
        key = next((k for k in weights if k in heads), None)
        if key is None:
            continue
        digest = weights_fingerprint(heads[key])
        if {(w or {}).get(key) for w in group["weights"]} != {digest}:
            raise SystemExit(f"{method}: the rows were decoded with other {key} weights than {heads[key]} "
                             f"({digest}): point --head at the folder they were decoded with")
        vocab = head_vocabulary(heads[key], group.iloc[0]["method_config"])
        ends = [t for ids, lengths in zip(group.output_ids, group.accept_lengths)
                for t in round_endings(list(ids), list(lengths))]
        tokens = [t for ids in group.output_ids for t in ids]
        tau = group.new_tokens.sum() / group.target_forwards.sum()
        lines.append(f"| {method} | {key} | {len(group)} | {len(ends)} | {tau:.2f} | "
                     f"{outside(ends, vocab) / len(ends):.3f} | {outside(tokens, vocab) / len(tokens):.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", type=Path, help="a results folder (paths.results)")
    ap.add_argument("--head", action="append", required=True, help="WEIGHTS_KEY=FOLDER, e.g. head=artifacts/...")
    args = ap.parse_args(argv)
    heads = {k: Path(v) for k, v in (h.split("=", 1) for h in args.head)}
    rows = load_rows(args.results)
    if rows.empty:
        raise SystemExit(f"{args.results}: no result rows")
    print(vocab_end_table(rows, heads))


if __name__ == "__main__":
    main()
