"""Streamed feature shards vs today's load-everything, side by side in one run: peak memory (RSS) and
tokens/s per step of the EAGLE-2 head trainer on SmolLM2-135M, with the CPU kind printed.

    python experiments/bench/bench_streaming.py                        # 24 shards x 16 sequences x 256 tokens
    python experiments/bench/bench_streaming.py --shards 96 --steps 8 --resident 2

The corpus: ``--shards`` feature shards of SmolLM2's shape (576-wide fp16 features, random token ids of
its vocabulary, answers from the middle of each sequence), written once to ``--corpus``; their values do
not matter for memory or speed (the loss still runs through SmolLM2's real LM head). Each mode trains in a
fresh process (``--child``) for ``--steps`` steps (0: one whole epoch) from the same seed; the peak RSS is the process's
``ru_maxrss``, printed beside the RSS after the target loaded (so the corpus's share shows). Shards are
memory-mapped as they load, so a page counts once a batch has touched it: only a whole epoch shows
what holding every shard costs. tokens/s per
step is the median of the real tokens / step time of the train rows (``tok_s`` of ``metrics.jsonl`` is a
running mean; this is per step), the first step excluded.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from eagle2.core.clock import device_clock

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MODES = {"in memory": None, "streamed": "resident"}


def write_corpus(folder: Path, shards: int, per_shard: int, length: int, hidden: int, vocab: int) -> Path:
    """``shards`` feature shards of random sequences (skipped when they are there)."""
    from eagle2.training.shards import write_shard

    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    for k in range(shards):
        path = folder / f"shard_{k:05d}.safetensors"
        if path.exists():
            continue
        rows = [(torch.randint(0, vocab, (length,), generator=g).tolist(),
                 torch.randn(length, hidden, generator=g).to(torch.float16), length // 2) for _ in range(per_shard)]
        write_shard(path, rows, hidden)
    return folder


def rss_mb() -> float:
    """Peak resident memory of this process so far, MB (Linux: ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(args) -> None:
    """Train the head for ``--steps`` steps in one mode; print one JSON line of figures."""
    from hydra import compose, initialize_config_dir

    from eagle2.bench.models import load_target
    from eagle2.training.objectives.eagle import train_head

    torch.set_num_threads(args.threads)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="train_head", overrides=["train=smollm2"])
    target, _ = load_target(cfg.model, kernels="stock")
    after_load = rss_mb()
    head_cfg = cfg.train.head
    head_cfg.merge_with({"max_steps": args.steps or None, "epochs": 1, "val_every": None, "val_max_sequences": 4,
                         "log_every": 1, "checkpoint_every": 10_000, "stop_when_flat": 0,
                         "resident_shards": args.resident if args.mode == "streamed" else None})
    out = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    steps: list[float] = []
    last = [device_clock("cpu")]

    def clock(step, stats):
        now = device_clock("cpu")
        steps.append(now - last[0])
        last[0] = now

    t0 = device_clock("cpu")
    train_head(target, args.corpus, head_cfg, out, on_step=clock)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    tokens = [r["tokens_per_step"] for r in train]
    rates = [n / dt for n, dt in zip(tokens[1:], steps[1:])]
    print(json.dumps({"mode": args.mode, "rss_after_load_mb": after_load, "peak_rss_mb": rss_mb(),
                      "tok_s": statistics.median(rates), "wall_s": device_clock("cpu") - t0,
                      "cpu_kind": train[-1]["cpu_kind"], "autocast": train[-1]["autocast"]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="artifacts/work/bench_streaming/corpus")
    ap.add_argument("--shards", type=int, default=24)
    ap.add_argument("--per-shard", type=int, default=16)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--steps", type=int, default=0, help="training steps per mode (0: one whole epoch)")
    ap.add_argument("--resident", type=int, default=2, help="shards in memory at once when streamed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.corpus = str(ROOT / args.corpus)
    if args.child:
        return child(args)
    from eagle2.core.cpu import cpu_kind

    corpus = write_corpus(Path(args.corpus), args.shards, args.per_shard, args.length, hidden=576, vocab=49152)
    size = sum(p.stat().st_size for p in corpus.glob("shard_*.safetensors")) / 1e6
    print(f"CPU kind: {cpu_kind()}, threads {args.threads}, torch {torch.__version__}; corpus {corpus}: "
          f"{args.shards} shards, {size:.0f} MB on disk; {args.steps or 'one epoch of'} steps of the SmolLM2 head "
          "recipe")
    results = {}
    for mode in MODES:
        cmd = [sys.executable, __file__, "--child", "--mode", mode, "--corpus", args.corpus, "--steps",
               str(args.steps), "--resident", str(args.resident), "--threads", str(args.threads)]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{'mode':24} {'RSS after load':>15} {'peak RSS':>9} {'above load':>11} {'tok/s per step':>15}")
    for mode, r in results.items():
        label = mode if mode == "in memory" else f"streamed ({args.resident} resident)"
        print(f"{label:24} {r['rss_after_load_mb']:>12.0f} MB {r['peak_rss_mb']:>6.0f} MB "
              f"{r['peak_rss_mb'] - r['rss_after_load_mb']:>8.0f} MB {r['tok_s']:>15.0f}")
    mem, stream = results["in memory"], results["streamed"]
    print(f"peak RSS streamed / in memory: {stream['peak_rss_mb'] / mem['peak_rss_mb']:.2f}; tok/s streamed / in "
          f"memory: {stream['tok_s'] / mem['tok_s']:.2f} (CPU kind {mem['cpu_kind']}, autocast {mem['autocast']})")


if __name__ == "__main__":
    main()
