"""Benchmark of the decoding round on SmolLM2, one run, this machine (``make bench-engine``):

1. verify cost T(q)/T(1), q = 1..33 tree tokens after a 256-token context (one target forward + LM head,
   median of ``--reps``), in bf16 with stock and with oneDNN-packed linears, and in fp32;
2. plain decoding tokens/s against transformers ``generate()`` on the stock model (what a user runs),
   bf16 and fp32, alternating, median ratio;
3. each method's round split (draft: head/draft-model forwards and tree building; verify; the rest:
   acceptance, KV commit, records; ms per round) on MT-bench first turns, before
   (stock linears, a concatenating ``DynamicCache``) and after (this machine's kernels, the in-place cache).

Every figure is printed beside the CPU kind (``eagle2.core.cpu.cpu_kind``).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from eagle2.bench.cost_profile import measure_verify
from eagle2.bench.methods import build_drafter
from eagle2.bench.runner import load_drafter_weights
from eagle2.core.cpu import cpu_kind
from eagle2.core.engine import generate
from eagle2.core.kernels import kernels_in_use
from eagle2.core.sampling import SamplingParams
from experiments.bench.side_by_side import first_turns, ours_against_generate, ratio_line, smollm2, smollm2_config


def verify_costs(args) -> None:
    print(f"\n## 1. T(q)/T(1), context {args.context}, median of {args.reps} ({cpu_kind()}, "
          f"{torch.get_num_threads()} threads)")
    qs = list(range(1, args.max_q + 1))
    columns = {}
    for dtype, kernels in (("bfloat16", "stock"), ("bfloat16", "auto"), ("float32", "auto")):
        _, model, _ = smollm2(dtype, kernels)
        name = f"{dtype} {kernels_in_use(model)}"
        if name in columns:  # auto left it stock on this CPU: already measured
            continue
        columns[name] = measure_verify(model, context=args.context, max_q=args.max_q, reps=args.reps)
    names = list(columns)
    print("| q | " + " | ".join(f"{n} ms | /T(1)" for n in names) + " |")
    print("|---|" + "---|---|" * len(names))
    for i, q in enumerate(qs):
        if q <= 9 or q % 4 == 1:
            cells = [f"{columns[n][i] * 1e3:.1f} | {columns[n][i] / columns[n][0]:.2f}" for n in names]
            print(f"| {q} | " + " | ".join(cells) + " |")


def plain_vs_generate(args) -> None:
    print(f"\n## 2. plain decoding vs transformers generate() on the stock model ({cpu_kind()}; "
          f"{args.prompts} MT-bench prompts x {args.new_tokens} tokens, {args.reps} alternating reps)")
    for dtype in args.dtypes:
        _, ours_model, tok = smollm2(dtype, "auto")
        _, stock_model, _ = smollm2(dtype, "stock")
        rates = ours_against_generate(ours_model, tok, first_turns(tok, args.prompts), args.new_tokens, args.reps,
                                      dtype, generate_model=stock_model)
        print(f"- {dtype} ({kernels_in_use(ours_model)} vs stock): {ratio_line(rates, 'ours', 'generate')}; last rep "
              f"{rates[-1]['ours']:.1f} vs {rates[-1]['generate']:.1f} tok/s")


def round_split(args) -> None:
    print(f"\n## 3. round split, ms per round ({cpu_kind()}; {args.prompts} MT-bench first turns x "
          f"{args.new_tokens} tokens, greedy)")
    print("| dtype | method | setup | tau | draft | (its forwards) | verify | accept+commit | round | tok/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dtype in args.dtypes:
        for setup, kernels, in_place in (("before: stock, DynamicCache", "stock", False),
                                         ("after: this CPU's kernels, in place", "auto", True)):
            _, target, tok = smollm2(dtype, kernels)
            batch = first_turns(tok, args.prompts)
            for method in args.methods:
                cfg = smollm2_config(dtype, kernels, f"method={method}")
                _round_row(dtype, method, setup, cfg, target, batch, args, in_place)


def _round_row(dtype, method, setup, cfg, target, batch, args, in_place: bool) -> None:
    method_cfg = cfg.method
    weights = load_drafter_weights(cfg, target)
    params = SamplingParams()
    runs = []
    for i, prompt in enumerate([batch[0], *batch]):  # the first is the warm-up
        drafter = build_drafter(method_cfg, target, params, None, weights=weights)
        out = generate(target, drafter, prompt, params, args.new_tokens, set(), in_place_cache=in_place)
        if i:
            runs.append(out)
    rounds = [r for out in runs for r in out.rounds]
    ms = {k: 1e3 * statistics.mean(getattr(r, k) for r in rounds)
          for k in ("draft_time_s", "draft_forward_s", "verify_forward_s", "other_s")}
    ms["other_s"] -= ms["draft_time_s"] - ms["draft_forward_s"]  # RoundStats.other_s includes the draft's own
    total = sum(ms[k] for k in ("draft_time_s", "verify_forward_s", "other_s"))
    tokens, wall = sum(len(o.output_ids) - 1 for o in runs), sum(o.wall_time_s for o in runs)
    tau = sum(sum(o.accept_lengths) for o in runs) / sum(o.target_forwards for o in runs)
    print(f"| {dtype} | {method} | {setup} | {tau:.2f} | {ms['draft_time_s']:.1f} | {ms['draft_forward_s']:.1f} | "
          f"{ms['verify_forward_s']:.1f} | {ms['other_s']:.1f} | {total:.1f} | {tokens / wall:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="verify,plain,rounds", help="which of verify, plain, rounds to run")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--max-q", type=int, default=33)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--methods", default="plain,eagle2,eagle3", type=lambda s: s.split(","))
    ap.add_argument("--dtypes", default="bfloat16,float32", type=lambda s: s.split(","))
    args = ap.parse_args()
    print(f"# bench-engine: SmolLM2-135M, {cpu_kind()} CPU, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    parts = args.parts.split(",")
    with torch.no_grad():
        if "verify" in parts:
            verify_costs(args)
        if "plain" in parts:
            plain_vs_generate(args)
        if "rounds" in parts:
            round_split(args)


if __name__ == "__main__":
    main()
