"""Benchmark: method=sps against transformers' assisted generation, same draft, same k, greedy.

Both decode MT-bench first turns on SmolLM2 in ``--dtype`` (default bfloat16; outputs equal in float32,
identity-audited in bfloat16) with the shipped SpS draft (or ``--draft``); EOS is
disabled so both produce the same number of tokens. Prints tokens/s of both, their median ratio
and our mean accepted length. Run: ``python -m experiments.bench.bench_sps_vs_assisted``.
"""

from __future__ import annotations

import argparse
import statistics

from eagle2.bench.runner import resolve_artifact
from eagle2.core.engine import generate
from eagle2.core.sampling import SamplingParams
from eagle2.drafters.sps import SpsDrafter
from eagle2.heads.draft_model import load_draft_model
from experiments.bench.side_by_side import (
    add_common_arguments,
    generate_decoder,
    ratio_line,
    side_by_side,
    smollm2_with_prompts,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--draft", default="artifacts/smollm2/sps_draft")
    ap.add_argument("--k", type=int, default=4)
    add_common_arguments(ap, reps=3)
    args = ap.parse_args()
    model, tok, prompts = smollm2_with_prompts(args.prompts, args.dtype)
    draft = load_draft_model(resolve_artifact(args.draft), model)
    n, taus = args.new_tokens, []

    def ours(prompt):
        out = generate(model, SpsDrafter(draft, SamplingParams(), args.k, None), prompt, SamplingParams(), n, set())
        taus.append(sum(out.accept_lengths) / out.target_forwards)
        return out.output_ids

    draft.generation_config.num_assistant_tokens = args.k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    # tau: over every decoding of ours, the comparison's included (each prompt as often as every other)
    rates = side_by_side({"sps": ours, "assisted": generate_decoder(model, tok, n, assistant_model=draft)},
                         prompts, args.reps, args.dtype)
    speeds = {name: statistics.median(r[name] for r in rates) for name in ("sps", "assisted")}
    print(f"{ratio_line(rates, 'sps', 'assisted')}; median tok/s sps {speeds['sps']:.2f}, assisted "
          f"{speeds['assisted']:.2f}; sps mean accepted length (tau) {statistics.mean(taus):.2f}; k={args.k}, "
          f"{len(prompts)} prompts x {n}, {args.dtype}")


if __name__ == "__main__":
    main()
