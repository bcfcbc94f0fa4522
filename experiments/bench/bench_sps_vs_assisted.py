"""Benchmark: method=sps against transformers' assisted generation, same draft, same k, greedy.

Both decode MT-bench first turns on SmolLM2 in ``--dtype`` (default bfloat16; outputs equal in float32,
identity-audited in bfloat16) with the shipped SpS draft (or ``--draft``); EOS is
disabled so both produce the same number of tokens. Prints tokens/s of both, their median ratio
and our mean accepted length. Run: ``python -m experiments.bench.bench_sps_vs_assisted``.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from eagle2.bench.runner import resolve_artifact
from eagle2.core.engine import generate
from eagle2.core.sampling import SamplingParams
from eagle2.drafters.sps import SpsDrafter
from eagle2.heads.draft_model import load_draft_model
from experiments.bench.side_by_side import add_common_arguments, alternating_rates, identity_line, smollm2_with_prompts


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

    def assisted(prompt):
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft, max_new_tokens=n,
                             do_sample=False, eos_token_id=None, pad_token_id=tok.pad_token_id)
        return out[0, len(prompt):].tolist()

    print(identity_line(args.dtype, {"sps": ours, "assisted": assisted}, prompts))  # also the warm-up
    taus.clear()
    rates = alternating_rates({"sps": ours, "assisted": assisted}, prompts, args.reps)
    ratios = [r["sps"] / r["assisted"] for r in rates]
    speeds = {name: [r[name] for r in rates] for name in ("sps", "assisted")}
    print(f"median ratio sps/assisted: {statistics.median(ratios):.3f}; median tok/s sps "
          f"{statistics.median(speeds['sps']):.2f}, assisted {statistics.median(speeds['assisted']):.2f}; "
          f"sps mean accepted length (tau) {statistics.mean(taus):.2f}; k={args.k}, {len(prompts)} prompts x {n}, "
          f"{args.dtype}")


if __name__ == "__main__":
    main()
