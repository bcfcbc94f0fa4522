"""What the side-by-side benchmarks share: SmolLM2 with MT-bench first-turn prompts, and timing two
decoders over the same prompts in alternating order, repetition after repetition."""

from __future__ import annotations

import time

from omegaconf import OmegaConf

from eagle2.chat import encode_conversation
from eagle2.data import benchmark_file, load_questions
from eagle2.models import load_target


def smollm2_with_prompts(n_prompts: int):
    """(model, tokenizer, prompt id lists) for the first ``n_prompts`` MT-bench first turns."""
    model, tok = load_target(OmegaConf.create({"source": "smollm2_gguf", "dtype": "float32", "device": "cpu"}))
    prompts = [encode_conversation(tok, "tokenizer", q["turns"][:1], [])
               for q in load_questions(benchmark_file("mt_bench"), n_prompts)]
    return model, tok, prompts


def alternating_rates(decoders: dict, prompts: list[list[int]], reps: int) -> list[dict[str, float]]:
    """Tokens/s of each decoder (name -> prompt -> output ids) per repetition; the order flips every
    repetition so that neither side always runs on a warmer machine. Prints one line per repetition."""
    names = list(decoders)
    rates = []
    for rep in range(reps):
        rate = {}
        for name in names if rep % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            tokens = sum(len(decoders[name](p)) for p in prompts)
            rate[name] = tokens / (time.perf_counter() - start)
        first, second = names
        print(f"rep {rep}: {first} {rate[first]:.2f} tok/s, {second} {rate[second]:.2f} tok/s, "
              f"ratio {rate[first] / rate[second]:.3f}", flush=True)
        rates.append(rate)
    return rates
