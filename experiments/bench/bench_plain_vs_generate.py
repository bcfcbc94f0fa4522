"""Benchmark: our plain decoding against transformers' generate() on SmolLM2, side by side.

Same prompts (MT-bench first turns), greedy, in ``--dtype`` (default bfloat16; outputs must be equal in
float32 and are identity-audited in bfloat16), same number of new tokens (EOS disabled for both),
alternating order, several repetitions; prints per-repetition tokens/s and the median ratio.
Timing covers prefill + decode for both. Run: ``python -m experiments.bench.bench_plain_vs_generate``.
"""

from __future__ import annotations

import argparse

import torch

from experiments.bench.side_by_side import add_common_arguments, ours_against_generate, ratio_line, smollm2_with_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    add_common_arguments(ap, reps=5)
    args = ap.parse_args()
    model, tok, prompts = smollm2_with_prompts(args.prompts, args.dtype)
    rates = ours_against_generate(model, tok, prompts, args.new_tokens, args.reps, args.dtype)
    print(f"{ratio_line(rates, 'ours', 'generate')}; {len(prompts)} prompts x {args.new_tokens} tokens, "
          f"{args.dtype}, {torch.get_num_threads()} threads")


if __name__ == "__main__":
    main()
