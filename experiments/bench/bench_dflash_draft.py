"""Benchmark: the draft's share of a round, DFlash against EAGLE-3 drafting as deep, on SmolLM2.

Both drafters are random stand-ins at SmolLM2's shapes (what they draft is not the question, what drafting costs
is): a 2-layer DFlash draft model with a block of ``--block`` (``eagle2.heads.dflash_head.write_random``'s shapes,
the target's LM head over the full vocabulary) and an EAGLE-3 head over a draft vocabulary of ``--draft-vocab``
(SmolLM2's recipe: 8192) drafting ``--block`` - 1 deep with ``--top-k`` and ``--total-tokens``. Each repetition
decodes the MT-bench first turns with one method then the other (the order flips every repetition); every round's
draft time (``RoundStats.draft_time_s``) and verify time are collected, and the medians per method are printed
with the draft's share of a round (draft / (draft + verify)) and the ratio of the draft times.
Run: ``python -m experiments.bench.bench_dflash_draft [--block 8] [--dtype bfloat16]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import torch
from omegaconf import OmegaConf

from eagle2.bench.methods import build_drafter
from eagle2.core.cpu import cpu_kind
from eagle2.core.engine import generate
from eagle2.core.features import eagle3_layers
from eagle2.core.sampling import SamplingParams
from eagle2.heads.checkpoint import cast_like_target
from eagle2.heads.dflash_head import FAMILY, write_random
from eagle2.heads.eagle3_head import Eagle3Head, eagle3_config_from_target
from eagle2.heads.shapes import fill_random
from experiments.bench.side_by_side import add_common_arguments, in_turn, smollm2_with_prompts


def random_heads(target, block: int, draft_vocab: int) -> dict:
    """{weight kind: a random drafter at SmolLM2's shapes}: the DFlash draft model and the EAGLE-3 head."""
    with tempfile.TemporaryDirectory() as folder:
        dflash = FAMILY.load(write_random(folder, target.config), target)
    dflash.block_size = block
    config = eagle3_config_from_target(target.config, draft_vocab)
    eagle3 = Eagle3Head(config, eagle3_layers(target.config.num_hidden_layers))
    fill_random(eagle3)
    eagle3.set_draft_vocabulary(torch.randperm(target.config.vocab_size, generator=torch.Generator().manual_seed(0))
                                [:draft_vocab])
    eagle3 = cast_like_target(eagle3.attach_embedding(target.get_input_embeddings()), target).eval()
    return {"dflash_head": dflash, "eagle3_head": eagle3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_arguments(ap, reps=3)
    ap.add_argument("--block", type=int, default=8, help="DFlash's block (EAGLE-3 drafts block - 1 deep)")
    ap.add_argument("--top-k", type=int, default=4, help="EAGLE-3's top_k (SmolLM2's eagle2.top_k)")
    ap.add_argument("--total-tokens", type=int, default=24, help="EAGLE-3's nodes (SmolLM2's max_total_tokens)")
    ap.add_argument("--draft-vocab", type=int, default=8192)
    args = ap.parse_args()
    torch.manual_seed(0)
    target, _, prompts = smollm2_with_prompts(args.prompts, args.dtype)
    heads = random_heads(target, args.block, args.draft_vocab)
    methods = {"dflash": {"name": "dflash", "top_k": 1, "total_tokens": args.block - 1},
               "eagle3": {"name": "eagle3", "depth": args.block - 1, "top_k": args.top_k,
                          "total_tokens": args.total_tokens}}
    rounds = {name: [] for name in methods}
    with torch.inference_mode():
        for rep in range(args.reps + 1):  # repetition 0 warms up
            for name in in_turn(list(methods), rep):
                for prompt in prompts:
                    drafter = build_drafter(OmegaConf.create(methods[name]), target, SamplingParams(), None,
                                            weights=heads)
                    out = generate(target, drafter, prompt, SamplingParams(), args.new_tokens, set())
                    if rep:
                        rounds[name] += [(r.draft_time_s, r.verify_forward_s) for r in out.rounds[1:]]
    print(f"SmolLM2 {args.dtype} on {cpu_kind()}: DFlash block {args.block} (one 2-layer forward) vs EAGLE-3 depth "
          f"{args.block - 1}, top_k {args.top_k}, {args.total_tokens} nodes; medians over {args.reps} alternating reps")
    medians = {}
    for name, timings in rounds.items():
        draft = statistics.median(d for d, _ in timings)
        verify = statistics.median(v for _, v in timings)
        share = statistics.median(d / (d + v) for d, v in timings)
        medians[name] = draft
        print(f"  {name:7s} rounds {len(timings):4d}  draft {draft * 1e3:7.2f} ms  verify {verify * 1e3:7.2f} ms  "
              f"draft share {share:.1%}")
    print(f"  draft time DFlash / EAGLE-3: {medians['dflash'] / medians['eagle3']:.2f}")


if __name__ == "__main__":
    main()
