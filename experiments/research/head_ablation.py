"""Head-training ablation on SmolLM2: train one EAGLE (or EAGLE-3) head per lever on the same corpus, then
tabulate.

    python -m experiments.research.head_ablation run base unroll3 --steps 300  # train + evaluate (resumable)
    python -m experiments.research.head_ablation table  # markdown table of all finished
    python -m experiments.research.head_ablation run answers_own_eagle3 --steps 60  # answer mode (sharegpt settings)
    python -m experiments.research.head_ablation table --answers  # ... its table

Every variant is ``python train_head.py`` with its own overrides (printed and stored in
``<root>/<variant>/command.txt``), its own run and export folders under ``--root``, and the same
corpus (the first ``--batches`` batches of the self-distillation corpus), step count and seed. Each
head is evaluated by the recipe's eval stage: teacher-forced top-1/top-4 and greedy-chain acceptance
on held-out MT-bench first turns (the target's greedy answers) and on held-out Alpaca shards. A
``<root>/previous_head/eval.json`` (the eval of the head a variant continues from) is listed first as
a reference row. ``artifacts/smollm2/ablation`` keeps each variant's eval.json, command.txt and
timing.json (``table --root artifacts/smollm2/ablation`` prints the card's table from them).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATASET_CORPUS = "artifacts/work/smollm2/corpus_dataset"
CONVERSATIONS = "artifacts/work/smollm2/conversations_corpus"  # train_head.py stage=features writes it

ALPACA = ["train.corpus.prompts=[data/train/alpaca_5000.json.gz]", "train.corpus.tap_layers=null"]  # the first corpus
OLD = [*ALPACA, "train.corpus.out_dir=artifacts/work/smollm2/corpus_alpaca"]  # where its variants now find it

SHAREGPT_TOKENS = "artifacts/work/sharegpt/tokens"  # train_head.py train=sharegpt stage=sharegpt
ANSWER_CORPORA = {  # corpus -> (token shards, what answers it holds)
    "conversations": ("artifacts/corpus/smollm2_conversations",
                      "today's corpus: two-turn self-instruct, the target's answers"),
    "dataset": (SHAREGPT_TOKENS, "ShareGPT, the dataset's own answers (EAGLE-1/2 recipe)"),
    "own": ("artifacts/work/sharegpt/own_answers",
            "ShareGPT first turns, the target's greedy answers (EAGLE-3 recipe)"),
}
ABLATED = ("head", "eagle3")  # the ablation's design (its variants are named by the two heads it compares)
SHAREGPT_SETTINGS = {kind: ["train=sharegpt", f"train.{kind}.resume_dir=null",
                            f"train.{kind}.val_set={SHAREGPT_TOKENS}",
                            f"train.{kind}.val_every=60", f"train.{kind}.lr=5e-4", f"train.{kind}.warmup=3",
                            f"train.{kind}.epochs=3"]  # (the smallest corpus, 153k tokens, is ~40 batches)
                     for kind in ABLATED}
ROUND5_HEAD = ("0151908", "artifacts/smollm2/eagle_head", "artifacts/work/round5/eagle_head")  # (commit, path, copy)
SHAREGPT_SETTINGS["head"].append(f"train.head.init_from={ROUND5_HEAD[2]}")  # the head round 6 replaced
SHAREGPT_SETTINGS["eagle3"].append("train.eagle3.init_from=artifacts/smollm2/eagle3_head")  # round 5, still shipped

VARIANTS: dict[str, tuple[str, list[str]] | tuple[str, list[str], str]] = {  # name -> (lever, overrides[, kind])
    # on the first corpus (Alpaca prompts only; --batches 40 of it)
    "base": ("random init, 1 step, target's greedy answers", [*OLD]),
    "half_data": ("half the training conversations (evenly spaced)", [*OLD, "train.head.max_train_sequences=624"]),
    "dataset_answers": ("Alpaca's own answers (teacher-forced) instead of the target's",
                        [*ALPACA, "train.corpus.responses=dataset", f"train.corpus.out_dir={DATASET_CORPUS}"]),
    "init_target": ("layer initialised from the target's last layer, fc = [0 | I]",
                    [*OLD, "train.head.init_from_target=true"]),
    "unroll2": ("training-time test: 2 draft steps on own features", [*OLD, "train.head.unroll=2"]),
    "unroll3": ("training-time test: 3 draft steps on own features", [*OLD, "train.head.unroll=3"]),
    "two_layers": ("2 decoder layers (format extension)", [*OLD, "train.head.num_layers=2"]),
    "prev_unroll3": ("the previous head continued with unroll 3 (lr 3e-4)",
                     [*OLD, "train.head.init_from=artifacts/work/prev_head", "train.head.unroll=3",
                      "train.head.lr=3e-4"]),
    # EAGLE-2 vs EAGLE-3 heads at equal data (the mixed corpus); kind eagle3 = train_head.py stage=eagle3
    # on the mixed chat/math/code corpus (conf/train/smollm2.yaml's; all its shards so far)
    "mix_eagle2": ("EAGLE-2 head, mixed corpus, unroll 3",
                   ["train.head.unroll=3", "train.head.unroll_cls_fraction=0.5"]),
    "mix_eagle2_more": ("the shipped EAGLE-2 head continued on the mixed corpus (unroll 3, lr 3e-4)",
                        ["train.head.init_from=artifacts/smollm2/eagle_head", "train.head.unroll=3",
                         "train.head.lr=3e-4"]),
    "mix_eagle3": ("EAGLE-3 head, mixed corpus, unroll 3 (training-time test)", [], "eagle3"),
    "mix_eagle3_unroll1": ("EAGLE-3 head, mixed corpus, no training-time test", ["train.eagle3.unroll=1"], "eagle3"),
    # the two-turn self-instruct conversations (artifacts/corpus/smollm2_conversations -> stage=features)
    "conv_eagle3": ("EAGLE-3 head, two-turn self-instruct conversations, unroll 3",
                    [f"train.corpus.out_dir={CONVERSATIONS}"], "eagle3"),
    "mix_eagle3_more": ("the shipped EAGLE-3 head continued on the grown mixed corpus (lr 5e-4)",
                        ["train.eagle3.init_from=artifacts/smollm2/eagle3_head", "train.eagle3.lr=5e-4"], "eagle3"),
    # answer mode at equal steps (train=sharegpt settings, 60 steps of 4,096 tokens, each head continued from its
    # round-5 weights, validated on the held-out ShareGPT conversations with the dataset's answers)
    **{f"answers_{corpus}_{kind}": (f"{'EAGLE-3' if kind == 'eagle3' else 'EAGLE'} head, {note}",
                                    [*SHAREGPT_SETTINGS[kind], f"train.corpus.out_dir={folder}"], kind)
       for corpus, (folder, note) in ANSWER_CORPORA.items() for kind in ABLATED},
}
STAGE_OF = {"head": ("head", "head"), "eagle3": ("eagle3", "eagle3_head")}  # kind -> (train section, export key)


def variant_kind(name: str) -> str:
    return VARIANTS[name][2] if len(VARIANTS[name]) > 2 else "head"


def variant_overrides(name: str, root: Path, steps: int, batches: int, threads: int,
                      extra: list[str] = ()) -> list[str]:
    """The variant's train_head.py overrides; ``extra`` (KEY=VALUE) replace the variant's own for the same key."""
    folder, kind = root / name, variant_kind(name)
    section, export = STAGE_OF[kind]
    replaced = {e.split("=", 1)[0] for e in extra}
    own = [o for o in VARIANTS[name][1] if o.split("=", 1)[0] not in replaced]
    return [f"threads={threads}", f"train.corpus.max_batches={batches}", f"train.{section}.max_steps={steps}",
            f"train.{section}.out_dir={folder / 'run'}", f"train.export.{export}={folder / 'head'}",
            f"train.eval.kinds=[{kind}]", *own, *extra]


def checkout_round5_head() -> None:
    """Copy the round-5 EAGLE head (the answer-mode ablation's start) out of git history, once."""
    commit, path, copy = ROUND5_HEAD
    if (ROOT / copy / "model.safetensors").exists():
        return
    names = subprocess.run(["git", "ls-tree", "--name-only", commit, path + "/"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    (ROOT / copy).mkdir(parents=True, exist_ok=True)
    for name in names:
        blob = subprocess.run(["git", "show", f"{commit}:{name}"], cwd=ROOT, check=True, capture_output=True).stdout
        (ROOT / copy / Path(name).name).write_bytes(blob)


def run_variant(name: str, root: Path, steps: int, batches: int, threads: int, extra: list[str] = ()) -> None:
    over = variant_overrides(name, root, steps, batches, threads, extra)
    if f"train.head.init_from={ROUND5_HEAD[2]}" in over:
        checkout_round5_head()
    # the eval stage measures on MT-bench and on the held-out shards of the self-distilled corpus (the same
    # for every variant), or of the conversations for a variant trained on them
    eval_over = [o for o in over if not o.startswith("train.corpus.out_dir=") or CONVERSATIONS in o]
    stages = (["corpus"] if any(o.startswith("train.corpus.responses=") for o in over) else []) + [variant_kind(name)]
    commands = [[sys.executable, "train_head.py", f"stage={s}", *over] for s in stages]
    commands.append([sys.executable, "train_head.py", "stage=eval", *eval_over])
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "command.txt").write_text("\n".join(shlex.join(c[1:]) for c in commands) + "\n")
    timing_file = folder / "timing.json"
    timing = json.loads(timing_file.read_text()) if timing_file.exists() else {}
    for stage, cmd in zip([*stages, "eval"], commands):
        print("+", shlex.join(cmd[1:]), flush=True)
        t0 = time.time()
        subprocess.run(cmd, cwd=ROOT, check=True)
        timing[stage] = timing.get(stage, 0.0) + time.time() - t0  # summed over resumed runs
        timing_file.write_text(json.dumps(timing, indent=2))


def variant_file(folder: Path, run_sub: str, name: str) -> Path | None:
    """A variant's ``name`` in its run folder (``folder/run_sub``) or in its record (copied side by side)."""
    return next((f for f in (folder / run_sub / name, folder / name) if f.exists()), None)


def _row(name: str, note: str, eval_json: Path, timing: dict) -> str:
    ev = json.loads(eval_json.read_text())
    mt, al = ev["mt_bench"], ev["alpaca_heldout"]
    acc = " ".join(f"{p:.3f}" for p in mt["chain"]["accept_ge"].values())
    trained = timing.get("head", timing.get("eagle3"))
    minutes = f"{trained / 60:.0f}" if trained else "-"
    return (f"| {name} | {note} | {mt['teacher_forced']['top1']:.3f} | {mt['teacher_forced']['top4']:.3f} | "
            f"{acc} | {mt['chain']['tau']:.2f} | {al['teacher_forced']['top1']:.3f} | {al['chain']['tau']:.2f} | "
            f"{minutes} |")


def table(root: Path) -> str:
    lines = ["| variant | lever | MT-bench top-1 | top-4 | P(len >= d), d = 1..5 | chain tau | "
             "Alpaca top-1 | Alpaca tau | train min |", "|---|---|---|---|---|---|---|---|---|"]
    if (root / "previous_head" / "eval.json").exists():
        lines.append(_row("previous_head", "the head shipped before (700 steps, 78 batches)",
                          root / "previous_head" / "eval.json", {}))
    for name, (note, *_) in VARIANTS.items():
        if name.startswith("answers_"):  # measured on MT-bench alone: answer_mode_table
            continue
        ev = variant_file(root / name, "head", "eval.json")
        if ev is None:
            continue
        timing_file = root / name / "timing.json"
        lines.append(_row(name, note, ev, json.loads(timing_file.read_text()) if timing_file.exists() else {}))
    return "\n".join(lines)


def answer_mode_table(root: Path) -> str:
    """The answer-mode ablation (``answers_*`` variants): held-out ShareGPT top-1 (the run's last validation)
    beside the eval stage's MT-bench first turns, per head kind and corpus."""
    lines = ["| head | corpus (answers) | held-out ShareGPT top-1 | MT-bench top-1 | top-4 | chain tau "
             "| tokens trained | train min |", "|---|---|---|---|---|---|---|---|"]
    for kind in ABLATED:
        for corpus, (_, note) in ANSWER_CORPORA.items():
            folder = root / f"answers_{corpus}_{kind}"
            ev = variant_file(folder, "head", "eval.json")
            if ev is None:
                continue
            mt = json.loads(ev.read_text())["mt_bench"]
            rows = [json.loads(line) for line in variant_file(folder, "run", "metrics.jsonl").read_text().splitlines()
                    if line]
            val = [r for r in rows if r["split"] == "val"][-1]
            timing = json.loads((folder / "timing.json").read_text())
            lines.append(f"| {'EAGLE-3' if kind == 'eagle3' else 'EAGLE'} | {note} | {val['top1']:.3f} | "
                         f"{mt['teacher_forced']['top1']:.3f} | {mt['teacher_forced']['top4']:.3f} | "
                         f"{mt['chain']['tau']:.2f} | {val['tokens_trained'] / 1e6:.2f}M | {timing[kind] / 60:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["run", "table"])
    ap.add_argument("variants", nargs="*", help=f"for run: some of {', '.join(VARIANTS)}")
    ap.add_argument("--root", type=Path, default=ROOT / "artifacts/work/ablation")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batches", type=int, default=40, help="corpus batches of 32 conversations")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra train_head.py override (replaces the variant's own for that key); repeatable")
    ap.add_argument("--answers", action="store_true", help="for table: the answer-mode ablation's table")
    args = ap.parse_args(argv)
    if args.action == "run":
        unknown = [v for v in args.variants if v not in VARIANTS]
        if unknown or not args.variants:
            ap.error(f"choose variants from {', '.join(VARIANTS)} (got {args.variants})")
        for name in args.variants:
            run_variant(name, args.root, args.steps, args.batches, args.threads, args.set)
    answer_variants = any(name.startswith("answers_") for name in args.variants)
    print(answer_mode_table(args.root) if answer_variants or args.answers else table(args.root))


if __name__ == "__main__":
    main()
