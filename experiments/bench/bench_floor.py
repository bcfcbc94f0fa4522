"""``make bench-floor``: the target at its memory floor. In one run on SmolLM2, side by side:

- the floor: the target's weights streamed once (every parameter read by a reduction, median of reps; and
  the same bytes as one buffer), at the best bandwidth this CPU reached;
- T(q) for q = 1..64: one target forward over a q-token chain after ``--context`` tokens (the cost profile's
  measurement), eager and compiled (``eagle2.core.compiled``), alternating per q, medians;
- plain decoding's ms per token, eager and compiled, and transformers' ``generate()``, alternating.

Prints the ratios and writes ``docs/results/floor/<cpu-kind>.md`` with its figure, stamped (commit, date,
CPU, threads, the load before and after, the command). Compile time is measured apart and printed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
from functools import partial
from pathlib import Path

import torch

from analysis.png import save_png
from analysis.results_page import cpu_description, git_commit
from eagle2.bench.cost_profile import median_time
from eagle2.core.cache import crop, forward_target, new_cache
from eagle2.core.clock import device_clock
from eagle2.core.compiled import attach
from eagle2.core.cpu import auto_dtype, cpu_kind
from eagle2.core.tree import DraftTree
from experiments.bench.side_by_side import generate_decoder, in_turn, plain_decoder, smollm2_with_prompts


def weight_bytes(model) -> int:
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def floor_s(model, reps: int) -> tuple[float, float]:
    """(seconds to read every weight once, the bytes' GB/s) at the better of two ways of streaming them."""
    params = list({p.data_ptr(): p.detach() for p in model.parameters()}.values())
    size = weight_bytes(model)
    flat = torch.ones(size // 4, dtype=torch.float32)
    per_param = median_time(lambda: [p.sum() for p in params], reps)
    one_buffer = median_time(lambda: flat.sum(), reps)
    best = min(per_param, one_buffer)
    return best, size / best / 1e9


def ms_per_token(decoder, prompt, n: int) -> float:
    """Decode-only ms per token: (time for n tokens - time for 1) / (n - 1), prefill cancelled; ``decoder(k)``
    is a decoder of k tokens (prompt -> output ids)."""
    t0 = device_clock("cpu")
    decoder(1)(prompt)
    one = device_clock("cpu") - t0
    t0 = device_clock("cpu")
    decoder(n)(prompt)
    return (device_clock("cpu") - t0 - one) / (n - 1) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dtype", default=auto_dtype("cpu"))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--max-q", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--out", default="docs/results/floor")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    model, tok, prompts = smollm2_with_prompts(1, args.dtype)
    prompt = prompts[0]
    eager_model = model
    floor, gbps = floor_s(model, 2 * args.reps + 1)
    decoder = attach(model)
    compile_s = decoder.warm_up()
    print(f"compile {compile_s:.1f} s (inductor's disk cache makes a rerun's shorter)", flush=True)

    def eager():
        if hasattr(model, "static_decoder"):
            del model.static_decoder

    def compiled():
        model.static_decoder = decoder

    curves = {"eager": [], "compiled": []}
    with torch.no_grad():
        for q in range(1, args.max_q + 1):
            for name, use in in_turn([("compiled", compiled), ("eager", eager)], q):
                use()
                curves[name].append(chain_s(model, q, args.context, args.reps))
            print(f"q={q}: eager {curves['eager'][-1] * 1000:.1f} ms, compiled {curves['compiled'][-1] * 1000:.1f} ms",
                  flush=True)
    decode_ms = _decode_rates(model, decoder, eager, compiled, prompt, tok, args)
    eager()
    load_after = os.getloadavg()
    summary = _summary(floor, gbps, curves, decode_ms, compile_s)
    print(summary)
    _write_page(args, summary, curves, floor, load_before, load_after, eager_model)


def chain_s(model, q: int, context: int, reps: int) -> float:
    """T(q): median seconds of one target forward (LM head included) over a chain of q tokens after
    ``context`` tokens, as the cost profile measures it."""
    gen = torch.Generator().manual_seed(q)
    vocab = model.config.vocab_size
    cache = new_cache(model)
    forward_target(model, torch.randint(vocab, (1, context), generator=gen), cache)
    tree = DraftTree(torch.randint(vocab, (q,), generator=gen), torch.arange(-1, q - 1), confidence=torch.ones(q))

    def verify():
        hidden = forward_target(model, tree.tokens[None], cache, attention_mask=tree.attention_mask(
            context, model.dtype), position_ids=tree.position_ids(context))
        model.lm_head(hidden[0])
        crop(cache, context)
    return median_time(verify, reps)


def _decode_rates(model, decoder, eager, compiled, prompt, tok, args) -> dict[str, float]:
    ours, hf = partial(plain_decoder, model), partial(generate_decoder, model, tok)
    runs = {"plain eager": (eager, ours), "plain compiled": (compiled, ours), "generate()": (eager, hf)}
    rates = {name: [] for name in runs}
    for _ in range(args.reps):
        for name, (use, decode) in runs.items():
            use()
            rates[name].append(ms_per_token(decode, prompt, args.new_tokens))
    return {name: statistics.median(values) for name, values in rates.items()}


def _summary(floor, gbps, curves, decode_ms, compile_s) -> str:
    t1e, t1c = curves["eager"][0] * 1000, curves["compiled"][0] * 1000
    fl = floor * 1000
    lines = ["| measure | ms | x floor |", "|---|---:|---:|",
             f"| floor (weights streamed once, {gbps:.1f} GB/s) | {fl:.1f} | 1.00 |",
             f"| T(1) eager | {t1e:.1f} | {t1e / fl:.2f} |", f"| T(1) compiled | {t1c:.1f} | {t1c / fl:.2f} |"]
    lines += [f"| {name} per token | {ms:.1f} | {ms / fl:.2f} |" for name, ms in decode_ms.items()]
    lines += ["", f"- compiled T(1) / eager T(1): {t1c / t1e:.2f}",
              f"- plain compiled over generate(): {decode_ms['generate()'] / decode_ms['plain compiled']:.2f}x; "
              f"plain eager over generate(): {decode_ms['generate()'] / decode_ms['plain eager']:.2f}x",
              "- T(q)/T(1) at q = 8, 16, 32, 64: eager " +
              ", ".join(f"{curves['eager'][q - 1] / curves['eager'][0]:.2f}" for q in (8, 16, 32, 64)
                        if q <= len(curves["eager"])) + "; compiled " +
              ", ".join(f"{curves['compiled'][q - 1] / curves['compiled'][0]:.2f}" for q in (8, 16, 32, 64)
                        if q <= len(curves["compiled"])),
              f"- compile: {compile_s:.1f} s in this run (outside every timing)"]
    return "\n".join(lines)


def _write_page(args, summary, curves, floor, load_before, load_after, model) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kind, out = cpu_kind(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    qs = range(1, len(curves["eager"]) + 1)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, values in curves.items():
        ax.plot(qs, [v * 1000 for v in values], marker=".", label=f"T(q) {name}")
    ax.axhline(floor * 1000, color="k", linestyle="--", label="floor: weights streamed once")
    ax.set_xlabel("q (tokens in one forward)")
    ax.set_ylabel("ms")
    ax.set_title(f"SmolLM2 {args.dtype}, {kind}, {torch.get_num_threads()} threads")
    ax.legend()
    fig.tight_layout()
    save_png(fig, out / f"{kind}.png", dpi=110)
    command = "python -m experiments.bench.bench_floor " + " ".join(sys.argv[1:])
    stamp = [f"- **Commit**: `{git_commit()}`", f"- **Date**: {dt.date.today().isoformat()}",
             f"- **Machine**: CPU kind {kind}; {cpu_description()}; {torch.get_num_threads()} threads",
             f"- **Dtype**: {args.dtype}; context {args.context}; {args.reps} reps per point",
             f"- **Load** (1/5/15 min): before {'/'.join(f'{x:.1f}' for x in load_before)}, after "
             f"{'/'.join(f'{x:.1f}' for x in load_after)}",
             f"- **Command**: `{command}`"]
    text = "\n".join([f"# The target at its memory floor: {kind}", "", *stamp, "", summary, "",
                      f"![T(q) against the floor]({kind}.png)", ""])
    (out / f"{kind}.md").write_text(text)
    print(f"wrote {out / (kind + '.md')}")


if __name__ == "__main__":
    main()
