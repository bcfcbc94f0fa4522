"""Benchmark: method=sps against transformers' assisted generation, same draft, same k, greedy.

Both decode MT-bench first turns on SmolLM2 with the shipped SpS draft (or ``--draft``); EOS is
disabled so both produce the same number of tokens. Prints tokens/s of both, their median ratio
and our mean accepted length. Run: ``python -m experiments.bench_sps_vs_assisted``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from omegaconf import OmegaConf

from eagle2.chat import encode_conversation
from eagle2.data import benchmark_file, load_questions
from eagle2.draft_model import load_draft_model
from eagle2.drafters.sps import SpsDrafter
from eagle2.engine import generate
from eagle2.models import load_target
from eagle2.runner import resolve_artifact
from eagle2.sampling import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--draft", default="artifacts/smollm2/sps_draft")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    model, tok = load_target(OmegaConf.create({"source": "smollm2_gguf", "dtype": "float32", "device": "cpu"}))
    draft = load_draft_model(resolve_artifact(args.draft), model)
    prompts = [encode_conversation(tok, "tokenizer", q["turns"][:1], [])
               for q in load_questions(benchmark_file("mt_bench"), args.prompts)]
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

    for p in prompts[:1]:
        assert ours(p) == assisted(p)[: n], "sps and assisted generation disagree"
    ratios, speeds = [], {"ours": [], "assisted": []}
    for rep in range(args.reps):
        times = {}
        for name, fn in (("ours", ours), ("assisted", assisted)) if rep % 2 == 0 else (("assisted", assisted),
                                                                                       ("ours", ours)):
            start = time.perf_counter()
            tokens = sum(len(fn(p)) for p in prompts)
            times[name] = tokens / (time.perf_counter() - start)
            speeds[name].append(times[name])
        ratios.append(times["ours"] / times["assisted"])
        print(f"rep {rep}: sps {times['ours']:.2f} tok/s, assisted {times['assisted']:.2f} tok/s, "
              f"ratio {ratios[-1]:.3f}", flush=True)
    print(f"median ratio sps/assisted: {statistics.median(ratios):.3f}; median tok/s sps "
          f"{statistics.median(speeds['ours']):.2f}, assisted {statistics.median(speeds['assisted']):.2f}; "
          f"sps mean accepted length (tau) {statistics.mean(taus):.2f}; k={args.k}, {len(prompts)} prompts x {n}")


if __name__ == "__main__":
    main()
