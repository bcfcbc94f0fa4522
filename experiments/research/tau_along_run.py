"""MT-bench tau of a long run's heads, logged along the run: one row per measurement in a JSON-lines log,
beside the same measurement of the heads the run started from (the shipped heads).

A measurement snapshots the run's two heads from its resume state (``snapshot_heads.snapshot``: the live
``--state`` folder, or ``--from-commit SHA``: the state as that commit holds it, weights included), decodes the
first ``--limit`` MT-bench questions (both turns) with EAGLE-3 and with EAGLE-2 on the EAGLE head, through
``run.py`` at temperature 0 with a fixed ``--budget``-token tree (so tau compares the heads, not the budget
rule), and appends to ``--log``: the state's step and tokens, each method's tau (the mean of the turns' tau
with its standard error, and pooled: all decode tokens over all target forwards), the protocol, the CPU kind
and the commit. ``--shipped`` measures the ``--init`` heads themselves (no state). tau counts tokens per target
forward, so it does not depend on the machine's load: a measurement can run beside the training it follows,
and ``--parallel`` decodes the two methods in two processes at once.

    python -m experiments.research.tau_along_run --state artifacts/smollm2/train_state/joint \\
        --init eagle3=artifacts/smollm2/eagle3_head --init head=artifacts/smollm2/eagle_head \\
        --log artifacts/smollm2/joint_run/tau.jsonl          # add --shipped, or --from-commit 64ca621
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
from safetensors.torch import load_file

from analysis.results_page import git_commit
from eagle2.core.cpu import cpu_kind
from eagle2.results.frames import load_rows
from eagle2.training.support.warm_state import WEIGHTS_FILE, weights_digest

ROOT = Path(__file__).resolve().parents[2]
METHODS = {"eagle3": "eagle3", "eagle2": "head"}  # method -> the joint run's head it drafts with


def state_at_commit(state: Path, commit: str, folder: Path) -> Path:
    """``state``'s ``resume.json`` and weights as ``commit`` holds them, written into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("resume.json", WEIGHTS_FILE):
        spec = f"{commit}:{state.resolve().relative_to(ROOT).as_posix()}/{name}"
        shown = subprocess.run(["git", "show", spec], cwd=ROOT, capture_output=True)
        if shown.returncode:
            raise SystemExit(f"{spec}: not in the repository ({shown.stderr.decode().strip()})")
        (folder / name).write_bytes(shown.stdout)
    return folder


def frozen_state(state: Path, folder: Path, tries: int = 3) -> Path:
    """A copy of the live ``state`` in ``folder`` whose weights are the ones its ``resume.json`` names (a
    running trainer rewrites both at every checkpoint: a copy taken across a rewrite is taken again)."""
    folder.mkdir(parents=True, exist_ok=True)
    for _ in range(tries):
        for name in ("resume.json", WEIGHTS_FILE):
            shutil.copyfile(state / name, folder / name)
        recorded = json.loads((folder / "resume.json").read_text()).get("weights_sha256")
        if recorded == weights_digest(load_file(str(folder / WEIGHTS_FILE))):
            return folder
    raise SystemExit(f"{state}: its weights kept changing under the copy ({tries} tries)")


def decode_commands(heads: dict[str, Path], results: Path, limit: int, max_new: int, budget: int,
                    parallel: bool = False) -> list[list[str]]:
    """``run.py``'s multirun over the two methods with the given head folders: one command, or with
    ``parallel`` one command a method (each on one thread; the rows go to separate files either way, and
    each command's Hydra sweep to its own folder under ``results``)."""
    groups = [[m] for m in METHODS] if parallel else [list(METHODS)]
    return [[sys.executable, str(ROOT / "run.py"), "-m", f"method={','.join(group)}",
             f"hydra.sweep.dir={results / 'sweeps' / '-'.join(group)}",
             f"model.eagle3_head={heads['eagle3']}", f"model.head={heads['head']}",
             f"model.eagle2.total_tokens={budget}", "dataset=mt_bench", f"dataset.limit={limit}",
             f"max_new_tokens={max_new}", "temperature=0.0", "threads=1", f"paths.results={results}"]
            for group in groups]


def tau_by_method(rows: pd.DataFrame) -> dict[str, dict]:
    """Per method of the result ``rows``: its turns, the mean of their tau (with its standard error over the
    turns) and the pooled tau."""
    out = {}
    for method, group in rows.groupby("method"):
        out[method] = {"turns": len(group), "tau": round(float(group.tau.mean()), 4),
                       "tau_sem": round(float(group.tau.std() / len(group) ** 0.5), 4) if len(group) > 1 else None,
                       "tau_pooled": round(float(group.decode_tokens.sum() / group.target_forwards.sum()), 4)}
    return out


def measure(heads: dict[str, Path], results: Path, limit: int, max_new: int, budget: int,
            parallel: bool = False) -> tuple[dict, str]:
    """Decode with ``heads`` into ``results``; ``tau_by_method`` of the rows, and the dtype they decoded in
    (the model's per-CPU choice)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    running = [subprocess.Popen(command, cwd=ROOT, env=env)
               for command in decode_commands(heads, results, limit, max_new, budget, parallel)]
    codes = [process.wait() for process in running]
    if any(codes):
        raise SystemExit(f"run.py exited {max(codes)}")
    rows = load_rows(results)
    if rows.empty:
        raise SystemExit(f"{results}: the decode wrote no rows")
    return tau_by_method(rows), ",".join(sorted(rows.dtype.unique()))


def log_row(label: str, position: dict, taus: dict[str, dict], dtype: str, args: argparse.Namespace) -> dict:
    """The log's row: what was measured, where the run was, each method's tau, the protocol and the machine."""
    return {"heads": label, "step": position.get("step"), "tokens_trained": position.get("tokens_trained"),
            **{f"{m}_{k}": v for m, stats in taus.items() for k, v in stats.items()},
            "dataset": "mt_bench", "questions": args.limit, "max_new_tokens": args.max_new,
            "total_tokens": args.budget, "dtype": dtype, "cpu_kind": cpu_kind(),
            "state_commit": args.from_commit, "commit": git_commit(ROOT),
            "date": f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", required=True, type=Path)
    ap.add_argument("--init", action="append", required=True, help="NAME=FOLDER: eagle3=... and head=...")
    ap.add_argument("--log", required=True, type=Path)
    ap.add_argument("--shipped", action="store_true", help="measure the --init heads themselves")
    ap.add_argument("--from-commit", help="the state as this commit holds it, not the live folder")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--parallel", action="store_true", help="decode the two methods in two processes at once")
    ap.add_argument("--keep", type=Path, help="keep the decode's result rows here (default: a temporary folder)")
    args = ap.parse_args()
    inits = {name: Path(folder) for name, _, folder in (item.partition("=") for item in args.init)}
    if set(inits) != set(METHODS.values()):
        ap.error(f"give --init for exactly {', '.join(METHODS.values())}")
    with tempfile.TemporaryDirectory(prefix="tau_along_run_") as tmp:
        work = Path(tmp)
        if args.shipped:
            heads, position, label = inits, {}, "shipped"
        else:
            from experiments.bench.side_by_side import smollm2
            from experiments.research.snapshot_heads import snapshot

            state = (state_at_commit(args.state, args.from_commit, work / "state") if args.from_commit
                     else frozen_state(args.state, work / "state"))
            position = json.loads((state / "resume.json").read_text())
            _, target, _ = smollm2("float32", "stock")
            stored = load_file(str(state / WEIGHTS_FILE))
            heads = {name: snapshot(state, f"heads.{name}.", folder, target, work / name, stored)
                     for name, folder in inits.items()}
            label = "snapshot"
        results = args.keep or work / "results"
        row = log_row(label, position, *measure(heads, results, args.limit, args.max_new, args.budget, args.parallel),
                      args)
    args.log.parent.mkdir(parents=True, exist_ok=True)
    with args.log.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
