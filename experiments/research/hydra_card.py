"""Write the Hydra heads' card (``artifacts/smollm2/hydra_head/README.md``) from their ``eval.json`` and
``training.json``, with the Medusa heads' held-out figures beside them (``medusa_eval.json``: the shipped
Medusa heads on the same held-out sets; else ``artifacts/smollm2/medusa_head/eval.json``) and the
full-rank ablation (``ablation/full_rank.{eval,training}.json``): same held-out sets, same tables.

    python -m experiments.research.hydra_card [--control "<the path-blanked control's output lines>"]
"""

# ruff: noqa: E501  (the card's markdown lines are written as they appear)
from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HYDRA, MEDUSA = ROOT / "artifacts/smollm2/hydra_head", ROOT / "artifacts/smollm2/medusa_head"
SETS = {"mt_bench": "MT-bench first turns (40, target's greedy answers)", "corpus_heldout": "corpus held-out shard (32)"}


def _heads(ev: dict) -> str:
    return " | ".join(" / ".join(f"{h[k]:.3f}" for k in ("top1", "top4", "top10")) for h in ev["per_head"].values())


def agreement_table(hydra: dict, medusa: dict) -> str:
    lines = ["| held-out set | heads | anchors | head 0 top-1 / top-4 / top-10 | head 1 | head 2 | tau, CPU tree "
             "(3 nodes) | tau, mc_sim_7b_63 (63 nodes) |", "|---|---|---|---|---|---|---|---|"]
    for key, name in SETS.items():
        for label, ev in (("**Hydra**", hydra[key]), ("Medusa", medusa[key])):
            taus = list(ev["tau"].values())
            lines.append(f"| {name} | {label} | {ev['anchors']:,} | {_heads(ev)} | {taus[0]:.2f} | {taus[1]:.2f} |")
    return "\n".join(lines)


def best_tree_table(hydra: dict, medusa: dict) -> str:
    lines = ["| nodes | Hydra, corpus held-out | Hydra, MT-bench | Medusa, MT-bench |", "|---|---|---|---|"]
    for n, t in hydra["mt_bench"]["best_trees"].items():
        c = hydra["corpus_heldout"]["best_trees"][n]
        m = medusa["mt_bench"]["best_trees"][n]
        lines.append(f"| {n} | {c['tau']:.2f} {c['choices'] if int(n) <= 4 else ''} | {t['tau']:.2f} "
                     f"{t['choices'] if int(n) <= 4 else ''} | {m['tau']:.2f} |")
    return "\n".join(lines)


def _ranks(training: dict) -> list:
    rank = training["recipe"].get("rank")
    return list(rank) if isinstance(rank, list) else [rank] * training["recipe"]["num_heads"]


def _rank_text(training: dict) -> str:
    ranks = _ranks(training)
    return "full rank" if not any(ranks) else "rank " + " / ".join(str(r or "full") for r in ranks)


def ablation_table(variants: dict) -> str:
    """Rows of name -> (eval, training) for the variants of the path blocks."""
    lines = ["| path blocks | parameters | bf16 size | training wall time | MT-bench top-1 h0 / h1 / h2 | MT-bench tau, "
             "CPU tree | corpus top-1 h0 / h1 / h2 | corpus tau, CPU tree |", "|---|---|---|---|---|---|---|---|"]
    for name, (ev, tr) in variants.items():
        params = sum(576 + ((r * 576 * (k + 2) + r * 576) if r else 576 * 576 * (k + 2))
                     for k, r in enumerate(_ranks(tr)))
        tops = {key: " / ".join(f"{h['top1']:.3f}" for h in ev[key]["per_head"].values()) for key in SETS}
        taus = {key: list(ev[key]["tau"].values())[0] for key in SETS}
        lines.append(f"| {name} | {params / 1e6:.2f}M | {2 * params / 1e6:.2f} MB | "
                     f"{tr['summary']['wall_time_s_this_process']:.0f} s | {tops['mt_bench']} | {taus['mt_bench']:.2f} | "
                     f"{tops['corpus_heldout']} | {taus['corpus_heldout']:.2f} |")
    return "\n".join(lines)


def card(hydra: dict, medusa: dict, training: dict, control: str, variants: dict) -> str:
    s, r = training["summary"], training["recipe"]
    t, v = s["train"], s["val"]
    rank = _rank_text(training)
    return f"""# Hydra heads for SmolLM2-135M-Instruct (`method=hydra`)

Hydra heads (Ankner et al., 2024) trained on a 2-core CPU machine (no GPU) by self-distillation with the
Medusa trainer, on the same data, loss, steps and batch as the shipped Medusa heads (`../medusa_head`),
loaded by `model=smollm2` (`model.hydra_head`). Figures come from `eval.json` / `training.json` beside the
weights; this card is written from them by `python -m experiments.research.hydra_card`. Method, format and
tests: `docs/hydra.md`.

**Reproduce:** `python train_head.py stage=hydra threads=1 train.medusa.corpus_dir=artifacts/work/smollm2/medusa_corpus`
(`conf/train/smollm2.yaml`: section `medusa`, with section `hydra` on top). The corpus is the Medusa heads'
20 shards (names in `training.json`, `corpus_shards`), rebuilt by the corpus stage, which is deterministic
(fixed prompt batches, greedy fp32 answers):
`python train_head.py stage=corpus threads=1 train.corpus.out_dir=artifacts/work/smollm2/medusa_corpus
train.corpus.tap_layers=null train.corpus.batches=[50,55,63,93,101,137,172,191,202,256,269,277,279,294,310,336,343,374,388,448]`.

## What is stored
- `config.json` + `hydra_heads.safetensors` ({training['stored_dtype']}): **{r['num_heads']} heads, {r['num_layers']} block each**;
  head k's block reads `[f[t]; e(x[t+1]); ...; e(x[t+k+1])]` (the target's last hidden state and the
  target's own embeddings of the path's k+1 tokens) and adds `SiLU(W z + b)` to `f[t]`, with `W` of
  **{rank}** for heads 0 / 1 / 2 (`up @ down`); the heads **share the target's frozen LM head**.
- `draft_vocab.safetensors`: the corpus answers' tokens, most frequent first (the Medusa heads' 5,087).

**Why {rank}?** The authors' full first block is an H x H*(k+2) matrix per head (plus, in their code, a
second one for the residual): 3.0M parameters for 3 heads here even with the residual taken as `f`, 6 MB
in bf16, and the tracked tree has to stay under 48 MiB (about 0.5 MB were left). Low ranks are what fits,
and most of them go to head 0, which every path starts with (ablation below: rank 24 for every head
agrees more at heads 1-2 and less at head 0, and has the lower tau). The Medusa heads it is compared with have a full H x H block each (1.0M parameters):
these Hydra heads get a sixth of the parameters, but the path's tokens. The full-rank heads, trained the
same way, are in the ablation below.

The Medusa figures below are the shipped (bf16) Medusa heads evaluated on the same held-out sets
(`medusa_eval.json`; within 0.001 of their own card, which evaluated them before the bf16 export).

## Training
| | value |
|---|---|
| loss | as Medusa's: head k, reading f[t] and the true tokens t+1..t+k+1, soft cross-entropy to the target's distribution at t+k+1, weight {r['decay']}^k |
| optimiser | AdamW {tuple(r['betas'])}, lr {r['lr']} cosine to {r['lr'] * r['min_lr_ratio']:g}, warmup {r['warmup']}, clip {r['grad_clip']}; blocks start at the identity on f |
| data | {s['train_sequences']} training conversations, {s['train_answer_tokens']:,} answer tokens; {s['val_sequences']} held out |
| steps | **{s['step']} x {r['token_budget']:,} padded tokens** ({t['tok_s']:.0f} tokens/s at the end) |
| wall time | {s['wall_time_s_this_process']:.0f} s with loading, 1 thread, beside other jobs on the 2 cores (the Medusa heads' 1,113 s ran under a heavier load: wall times on this shared machine do not compare) |
| last training batch | top-1 per head {' / '.join(f"{t[f'top1_h{k}']:.2f}" for k in range(r['num_heads']))} (held-out: {' / '.join(f"{v[f'top1_h{k}']:.2f}" for k in range(r['num_heads']))}) |

## Held-out agreement, next to the Medusa heads
Top-k: is the target's greedy token t+k+2 among head k's k best choices at f[t], the path's tokens being
the true ones (what drafting reads while the path is right; for Medusa the path is not read); a token outside
the draft vocabulary counts as a miss. Tau: 1 + the expected accepted drafts per round of a tree, from the
same rank statistics (greedy decoding, bonus token included): exact for Hydra too, since a node is on the
true path only if its path is the true one.

{agreement_table(hydra, medusa)}

Best trees by size, expected tau (paths in Medusa's notation, read per path for Hydra):

{best_tree_table(hydra, medusa)}

## Ablation: the path blocks' rank
Same command with `train.hydra.rank=24` or `train.hydra.rank=null` (and another `out_dir`/`export`);
`ablation/<variant>.{{eval,training}}.json`. Full rank is not shipped: it is over the size limit.

{ablation_table({"**" + rank + " (shipped)**": (hydra, training), **variants})}

At equal data and steps the authors' full blocks beat the Medusa heads on every head, the deeper ones most
(they see the path): MT-bench tau 1.47 against Medusa's 1.35 on the CPU tree. The low-rank blocks that fit
lose head 0's agreement to Medusa's full matrix, so their tau stays below Medusa's. Shipping the full
blocks needs about 6 MB more room in the tracked tree.

## The control: the same heads, path blanked
`python -m experiments.research.hydra_path_control --prompts 5 --new-tokens 64` (fp32, greedy, 5 MT-bench
first turns): the shipped heads, then the same heads with every path embedding replaced by zeros (head k
ignores the tokens before it). Both must equal plain decoding; the blanked heads must accept less.

{control or "(not measured)"}
"""


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--control", default="", help="text for the path-blanked control's section")
    args = ap.parse_args(argv)
    load = lambda p: json.loads(p.read_text()) if p.is_file() else None  # noqa: E731
    medusa = load(HYDRA / "medusa_eval.json") or load(MEDUSA / "eval.json")
    variants = {name: (load(HYDRA / f"ablation/{key}.eval.json"), load(HYDRA / f"ablation/{key}.training.json"))
                for key, name in (("rank24", "rank 24 each"), ("full_rank", "full rank (not shipped)"))
                if (HYDRA / f"ablation/{key}.eval.json").is_file()}
    text = card(load(HYDRA / "eval.json"), medusa, load(HYDRA / "training.json"), args.control, variants)
    (HYDRA / "README.md").write_text(text)
    print(HYDRA / "README.md")


if __name__ == "__main__":
    main()
