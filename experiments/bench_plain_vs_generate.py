"""Benchmark: our plain decoding against transformers' generate() on SmolLM2, side by side.

Same prompts (MT-bench first turns), greedy, same number of new tokens (EOS disabled for both),
alternating order, several repetitions; prints per-repetition tokens/s and the median ratio.
Timing covers prefill + decode for both. Run: ``python -m experiments.bench_plain_vs_generate``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from omegaconf import OmegaConf

from eagle2.chat import encode_conversation
from eagle2.data import benchmark_file, load_questions
from eagle2.drafters.plain import PlainDrafter
from eagle2.engine import generate
from eagle2.models import load_target
from eagle2.sampling import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    model, tok = load_target(OmegaConf.create({"source": "smollm2_gguf", "dtype": "float32", "device": "cpu"}))
    prompts = [encode_conversation(tok, "tokenizer", q["turns"][:1], [])
               for q in load_questions(benchmark_file("mt_bench"), args.prompts)]
    n = args.new_tokens

    def ours(prompt):
        out = generate(model, PlainDrafter(), prompt, SamplingParams(), n, set())
        return out.output_ids

    def hf(prompt):
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=tok.pad_token_id)
        return out[0, len(prompt):].tolist()

    for p in prompts[:1]:  # warm-up, and a check that both decode the same tokens
        assert ours(p) == hf(p), "plain decoding and generate() disagree"
    ratios = []
    for rep in range(args.reps):
        times = {}
        for name, fn in (("ours", ours), ("generate", hf)) if rep % 2 == 0 else (("generate", hf), ("ours", ours)):
            start = time.perf_counter()
            tokens = sum(len(fn(p)) for p in prompts)
            times[name] = tokens / (time.perf_counter() - start)
        ratios.append(times["ours"] / times["generate"])
        print(f"rep {rep}: ours {times['ours']:.2f} tok/s, generate {times['generate']:.2f} tok/s, "
              f"ratio {ratios[-1]:.3f}", flush=True)
    print(f"median ratio ours/generate over {args.reps} reps: {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}); {len(prompts)} prompts x {n} tokens, "
          f"{torch.get_num_threads()} threads")


if __name__ == "__main__":
    main()
