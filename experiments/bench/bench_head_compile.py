"""Benchmark: the draft head's compiled path (``engine.compile=true``, ``eagle2/heads/static_head.py``) against
its eager forward, on SmolLM2 with its shipped EAGLE head, in one run, side by side:

1. one head draft forward, ms per call, eager and compiled, at the row counts EAGLE-2 feeds it: a catch-up of
   1-2 accepted pairs, a depth of ``top_k`` nodes (4 on SmolLM2; the authors' 10 runs as bucket 16), after
   ``--context`` committed positions; medians of ``--reps``, alternating eager / compiled per row count;
2. EAGLE-2 end to end, tokens/s on MT-bench first turns: eager target + eager head against compiled target +
   compiled head, alternating per repetition (``side_by_side.alternating_rates``); the outputs compared.

Compile seconds are printed apart (inductor's disk cache: a rerun loads them); nothing compiles inside a
timing. Run: ``python -m experiments.bench.bench_head_compile --threads 1``.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from omegaconf import OmegaConf

from eagle2.bench.cost_profile import median_time
from eagle2.bench.methods import build_drafter
from eagle2.bench.runner import load_drafter_weights
from eagle2.core.cache import crop, new_cache
from eagle2.core.compiled import attach, bucket
from eagle2.core.cpu import cpu_kind
from eagle2.core.engine import generate
from eagle2.core.sampling import SamplingParams
from eagle2.heads.eagle_head import causal_mask
from eagle2.heads.static_head import attach_head, forward_head
from experiments.bench.side_by_side import alternating_rates, first_turns, in_turn, smollm2

ROWS = (1, 2, 4, 10)  # catch-ups of 1 and 2 pairs; a depth of top_k = 4 (SmolLM2) and 10 (the authors')


def head_inputs(head, q: int, start: int, gen: torch.Generator):
    """Random (tokens, features, positions, causal mask) of ``q`` rows at positions ``start..``."""
    dtype, h = next(head.parameters()).dtype, head.config.hidden_size
    tokens = torch.randint(head.config.vocab_size, (1, q), generator=gen)
    feats = torch.randn(1, q, h, generator=gen).to(dtype)
    return tokens, feats, torch.arange(start, start + q)[None], causal_mask(q, start, dtype)


def step_ms(head, cache, q: int, context: int, reps: int) -> float:
    """Median ms of one head forward of ``q`` rows after ``context`` committed positions in ``cache``."""
    gen = torch.Generator().manual_seed(q)
    crop(cache, 0)
    forward_head(head, *head_inputs(head, context, 0, gen), cache)
    rows = head_inputs(head, q, context, gen)

    def once():
        crop(cache, context)
        forward_head(head, *rows, cache)
    return median_time(once, reps) * 1e3


def draft_steps(head, eager_cache, static_cache, args) -> None:
    print(f"\n## 1. EAGLE head draft forward, ms per call, context {args.context}, median of {args.reps}")
    print("| rows | bucket | eager ms | compiled ms | eager / compiled |\n|---:|---:|---:|---:|---:|")
    with torch.no_grad():
        for q in ROWS:
            ms = {}
            for name, cache in in_turn([("compiled", static_cache), ("eager", eager_cache)], q):
                ms[name] = step_ms(head, cache, q, args.context, args.reps)
            print(f"| {q} | {bucket(q)} | {ms['eager']:.3f} | {ms['compiled']:.3f} | "
                  f"{ms['eager'] / ms['compiled']:.2f}x |", flush=True)


def end_to_end(target, tokenizer, cfg, weights, decoder, head_static, args) -> None:
    method = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)["method"])
    method.total_tokens = args.total_tokens  # fixed: an auto budget's profile would differ between the two
    head, params = weights["head"], SamplingParams()
    prompts = first_turns(tokenizer, args.prompts)

    def use(compiled: bool):
        for module, static in ((target, decoder), (head, head_static)):
            if compiled:
                module.static_decoder = static
            elif hasattr(module, "static_decoder"):
                del module.static_decoder

    def decode(compiled: bool):
        def run(prompt):
            use(compiled)
            drafter = build_drafter(method, target, params, None, weights=weights)
            return generate(target, drafter, prompt, params, args.new_tokens, set()).output_ids
        return run

    decoders = {"compiled": decode(True), "eager": decode(False)}
    print(f"\n## 2. EAGLE-2 (depth {method.depth}, top_k {method.top_k}, total_tokens {method.total_tokens}) "
          f"end to end, {len(prompts)} MT-bench prompts x {args.new_tokens} new tokens")
    with torch.no_grad():
        for p in prompts[:1]:  # warm-up, untimed
            decoders["eager"](p), decoders["compiled"](p)
        rates = alternating_rates(decoders, prompts, args.reps)
        same = sum(decoders["eager"](p) == decoders["compiled"](p) for p in prompts)
    use(False)
    med = {name: statistics.median(r[name] for r in rates) for name in decoders}
    print("| path | tokens/s (median) |\n|---|---:|")
    for name in ("eager", "compiled"):
        print(f"| {name} target + head | {med[name]:.2f} |")
    print(f"- compiled / eager: {med['compiled'] / med['eager']:.2f}x; outputs identical on {same}/{len(prompts)} "
          f"prompts ({cfg.model.dtype}: a difference may be numeric)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--e2e-reps", type=int, default=2)
    ap.add_argument("--total-tokens", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg, target, tokenizer = smollm2(args.dtype, "auto", "method=eagle2")
    weights = load_drafter_weights(cfg, target)
    head = weights["head"]
    print(f"# bench-head-compile: SmolLM2-135M {args.dtype} + its EAGLE head, {cpu_kind()} CPU, torch "
          f"{torch.__version__}, {torch.get_num_threads()} thread(s)")
    eager_cache = new_cache(head)  # before the head has its compiled path: the eager in-place cache
    decoder, head_static = attach(target), attach_head(head)
    target_s, head_s = decoder.warm_up(), head_static.warm_up()
    print(f"compile (outside every timing): target {target_s:.1f} s, head {head_s:.1f} s")
    draft_steps(head, eager_cache, head_static.new_cache(), args)
    args.reps = args.e2e_reps
    end_to_end(target, tokenizer, cfg, weights, decoder, head_static, args)


if __name__ == "__main__":
    main()
