"""Benchmark: our plain decoding against transformers' generate() on SmolLM2, side by side.

Same prompts (MT-bench first turns), greedy, in ``--dtype`` (default bfloat16; outputs must be equal in
float32 and are identity-audited in bfloat16), same number of new tokens (EOS disabled for both),
alternating order, several repetitions; prints per-repetition tokens/s and the median ratio.
Timing covers prefill + decode for both. Run: ``python -m experiments.bench.bench_plain_vs_generate``.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from eagle2.core.engine import generate
from eagle2.core.sampling import SamplingParams
from eagle2.drafters.plain import PlainDrafter
from experiments.bench.side_by_side import add_common_arguments, alternating_rates, identity_line, smollm2_with_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    add_common_arguments(ap, reps=5)
    args = ap.parse_args()
    model, tok, prompts = smollm2_with_prompts(args.prompts, args.dtype)
    n = args.new_tokens

    def ours(prompt):
        out = generate(model, PlainDrafter(), prompt, SamplingParams(), n, set())
        return out.output_ids

    def hf(prompt):
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=tok.pad_token_id)
        return out[0, len(prompt):].tolist()

    print(identity_line(args.dtype, {"ours": ours, "generate": hf}, prompts))  # also the warm-up
    rates = alternating_rates({"ours": ours, "generate": hf}, prompts, args.reps)
    ratios = [r["ours"] / r["generate"] for r in rates]
    print(f"median ratio ours/generate over {args.reps} reps: {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}); {len(prompts)} prompts x {n} tokens, "
          f"{args.dtype}, {torch.get_num_threads()} threads")


if __name__ == "__main__":
    main()
