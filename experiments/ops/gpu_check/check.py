"""``make gpu-check``: is a fresh GPU node ready for the paper's runs? One command of at most 8 minutes:
no hub, no real weights, no omegaconf/hydra; the stages of ``experiments.ops.gpu_check.stages`` on
random-weight models at the real shapes (Vicuna-7B, LLaMA-3.1-8B, each in its config's dtype), each row
with its pass criterion (the table in that module's docstring).

Each selected stage (``--stages``, default all, in the given order) runs as
``python -m experiments.ops.gpu_check.stages STAGE`` in a child process (its own session) killed at the stage's
time limit (``gpu_stages.LIMITS_S`` on CUDA, ``CPU_LIMIT_S`` on a CPU, or ``--stage-limit-s``), and never
past what is left of the whole-check budget (``--budget-s``, default 480 s = 8 minutes, model builds
included). A killed or crashed stage keeps the rows it wrote and adds one failed row saying why; the
next stages still run while the budget lasts; a stage the budget no longer reaches is a failed row
("not run"). At most ``MAX_FILES`` (8) files are written into the output folder ``DIR`` (``--out DIR``),
three in fact, each rewritten after every stage so that a run killed from outside still leaves what finished:

- ``gpu_check.json``: the machine's facts, every stage's rows (with its criterion and status) and how
  each stage's child ran (``stage_runs``);
- ``gpu_check.log``: every stage's stderr, one after the other under a ``==== STAGE`` header;
- ``stages.tar``: each stage's own rows file and stderr (``STAGE.json``, ``STAGE.log``) as the child wrote them.

The children write into a working folder outside ``DIR`` (``--work``, default a temporary folder removed
at the end). At the end one summary table is printed, with the EAGLE-2 round's draft/verify/other split.

Exit status: 0 every row ok (or skipped with a reason); 1 a row failed; 2 an environment problem (an
NVIDIA GPU is here but torch has no CUDA, or ``--device cuda`` without CUDA). The launcher
``experiments.ops.gpu_check.env`` (what ``make gpu-check`` runs) exits 0 first on a machine without a GPU, 3 on a
missing package, 4 on a bad bundle.

On a CPU (``--device cpu``, ``make gpu-check CPU_HALF=1``) the same stages run at CPU-proxy size (2-layer
models with head dimension 8 and the real vocabularies, a small EAGLE-2 budget; ``syncs`` skipped): the
whole pipeline without a GPU, in 2-3 minutes on two cores; the timing criteria need CUDA.

    python -m experiments.ops.gpu_check [--stages audit_vicuna7b,verify_cost] [--budget-s 480] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from experiments.ops.gpu_check.stages import LIMITS_S, STAGES

ROOT = Path(__file__).resolve().parents[3]
OK, FAILED, ENVIRONMENT = 0, 1, 2
CPU_LIMIT_S = 150  # per stage on a CPU: a child's imports alone take ~10 s on a busy 2-core machine
MIN_START_S = 5.0  # a stage is not started with less budget left than this
SHOWN_Q = (2, 8, 16, 32, 60, 64)  # T(q)/T(1) in the table (60: the authors' total_token)
MAX_FILES = 8  # what the output folder may hold: gpu_check.json, gpu_check.log, stages.tar
REPORT, LOG, ARCHIVE = "gpu_check.json", "gpu_check.log", "stages.tar"


def stage_command(stage: str, device: str, rows: Path) -> list[str]:
    """The child process that runs one stage and rewrites ``rows`` after each row."""
    return [sys.executable, "-m", "experiments.ops.gpu_check.stages", stage, "--device", device, "--rows", str(rows)]


def run_stage(stage: str, device: str, folder: Path, limit_s: float) -> tuple[list[dict], dict]:
    """(the stage's rows, how its child ran), the child killed (its whole process group) at ``limit_s``."""
    folder.mkdir(parents=True, exist_ok=True)
    rows_path, log_path = folder / f"{stage}.json", folder / f"{stage}.log"
    rows_path.unlink(missing_ok=True)
    start, killed = time.monotonic(), False
    with open(log_path, "w") as log:
        child = subprocess.Popen(stage_command(stage, device, rows_path), cwd=ROOT, stderr=log,
                                 start_new_session=True)
        try:
            code = child.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            killed, code = True, None
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
    wall = time.monotonic() - start
    rows = read_rows(rows_path)
    if killed:
        rows.append(failed_row(stage, f"finishes within its limit of {limit_s:.0f} s",
                               f"killed at {limit_s:.0f} s, after {len(rows)} finished row(s)"))
    elif code and not any(r.get("status") == "failed" for r in rows):
        rows.append(failed_row(stage, "the stage exits 0", f"exit {code}: {last_error(log_path)}"))
    elif not rows:
        rows.append(failed_row(stage, "the stage writes its rows", f"exit {code} without a row"))
    return rows, {"stage": stage, "limit_s": limit_s, "wall_s": wall, "returncode": code, "killed": killed}


def read_rows(path: Path) -> list[dict]:
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def last_error(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.exists() else []
    return lines[-1].strip()[:300] if lines else "no stderr"


def failed_row(stage: str, criterion: str, error: str) -> dict:
    return {"stage": stage, "case": "the stage", "status": "failed", "criterion": criterion, "error": error}


def write_report(path: Path, report: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str))
    os.replace(tmp, path)


def pack_stages(work: Path, out: Path, stages: list[str]) -> None:
    """Rewrite ``out/gpu_check.log`` (every stage's stderr in turn) and ``out/stages.tar`` (each stage's
    rows file and stderr) from the working folder, atomically, for the ``stages`` run so far."""
    log_tmp, tar_tmp = out / (LOG + ".tmp"), out / (ARCHIVE + ".tmp")
    with open(log_tmp, "w") as log, tarfile.open(tar_tmp, "w") as tar:
        for stage in stages:
            stderr = work / f"{stage}.log"
            text = stderr.read_text(errors="replace") if stderr.exists() else "(no stderr: not run)\n"
            log.write(f"==== {stage}\n{text}{'' if text.endswith(chr(10)) else chr(10)}")
            for name in (f"{stage}.json", f"{stage}.log"):
                if (work / name).exists():
                    tar.add(work / name, arcname=name)
    os.replace(log_tmp, out / LOG)
    os.replace(tar_tmp, out / ARCHIVE)


# ---- the summary table -------------------------------------------------------------------------------

def result_text(row: dict) -> str:
    if "error" in row or "reason" in row:
        return row.get("error") or row["reason"]
    stage = row["stage"]
    drafting = (f"accepted {row.get('accepted')}/{row.get('drafted')} drafted, tau {row.get('tau', 0):.2f}"
                if "accepted" in row else "")
    if stage.startswith("audit"):
        note = "" if row.get("tolerance_measured", True) else " (UNMEASURED: borrowed)"
        spread = (f"; gap error max {row['error_ratio_max']:.2f} eps*max|z|, factor {row['tolerance_factor']:g}"
                  f"{note}" if "error_ratio_max" in row else note)
        return (f"{row['identical']}/{row['turns']} identical, {row['numeric']} numeric, "
                f"{row['algorithmic']} algorithmic; {drafting}{round_split(row)}{spread}")
    if stage == "exact_fp32":
        return f"{row['identical']}/{row['turns']} identical; {drafting}{round_split(row)}"
    if stage == "verify_cost":
        clock = "gpu" if "ratio_gpu" in row else "wall"
        ratio = row[f"ratio_{clock}"]
        by_q = dict(zip(row.get("q") or range(1, len(ratio) + 1), ratio))  # the q timed (a sample of 1..max)
        shown = " ".join(f"{q}:{by_q[q]:.2f}" for q in SHOWN_Q if q in by_q)
        return f"T(1) {row[f'T1_{clock}_ms']:.2f} ms ({clock}); T(q)/T(1) {shown}"
    if stage == "draft_cost":
        return "ms by depth " + " ".join(f"{t:.2f}" for t in row["draft_ms"])
    if stage == "syncs":
        return (f"{row['implicit_per_round']:.1f} implicit, {row['explicit_per_round']:.1f} explicit syncs "
                f"per round ({row['rounds']} rounds)")
    return ""


def round_split(row: dict) -> str:
    """The EAGLE-2 round's mean draft / verify / other milliseconds (``split_ms`` of a decoding row)."""
    split = row.get("split_ms")
    if not split:
        return ""
    return (f"; round {split['round']:.2f} ms = draft {split['draft']:.2f} + verify {split['verify']:.2f} "
            f"+ other {split['other']:.2f}")


def print_table(rows: list[dict]) -> None:
    print("| stage | case | status | result | criterion |\n|---|---|---|---|---|")
    for row in rows:
        try:
            text = result_text(row)
        except (KeyError, TypeError, IndexError) as exc:  # a row from another version: still listed
            text = f"(unreadable row: {exc!r})"
        print(f"| {row.get('stage')} | {row.get('case')} | {row.get('status')} | {text} | {row.get('criterion', '')} |")


# ---- the command -------------------------------------------------------------------------------------

def pick_device(wanted: str) -> tuple[str | None, dict]:
    """(the stages' device, or None for an environment problem; facts for the report)."""
    import torch

    from experiments.ops.gpu_check.env import nvidia_gpus

    cuda = torch.cuda.is_available()
    facts = {"torch": torch.__version__, "cuda": cuda, "torch_cuda": torch.version.cuda,
             "device": torch.cuda.get_device_name(0) if cuda else "cpu"}
    if wanted == "cpu":
        return "cpu", {**facts, "device": "cpu"}
    if cuda:
        return "cuda", facts
    gpus = nvidia_gpus()
    if wanted == "cuda" or gpus:
        print(f"[gpu-check] {'; '.join(gpus) or 'no NVIDIA GPU'}, but torch {torch.__version__} cannot use CUDA "
              "(a CPU build, or CUDA failed to initialise): environment problem", file=sys.stderr)
        return None, facts
    print("[gpu-check] no CUDA device on this machine: running the CPU half", flush=True)
    return "cpu", facts


def parse_stages(text: str) -> list[str]:
    stages = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        raise argparse.ArgumentTypeError(f"unknown stage(s) {', '.join(unknown) or '(none given)'}; "
                                         f"choose from {','.join(STAGES)}")
    return stages


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    ap = argparse.ArgumentParser(prog="python -m experiments.ops.gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", type=parse_stages, default=list(STAGES), help=f"comma list from {','.join(STAGES)}")
    ap.add_argument("--budget-s", type=float, default=480.0, help="the whole check, model builds included")
    ap.add_argument("--stage-limit-s", type=float, default=None,
                    help=f"every stage's limit (default: gpu_stages.LIMITS_S on CUDA, {CPU_LIMIT_S} on a CPU)")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                    help="auto: CUDA if torch sees it, the CPU half where no NVIDIA GPU is present")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "gpu_check",
                    help=f"folder for {REPORT}, {LOG} and {ARCHIVE} (a path ending .json: that file, in its folder)")
    ap.add_argument("--work", type=Path, default=None,
                    help="the stages' working folder (default: a temporary folder, removed at the end)")
    args = ap.parse_args(argv)
    out, path = (args.out.parent, args.out) if args.out.suffix == ".json" else (args.out, args.out / REPORT)
    out.mkdir(parents=True, exist_ok=True)
    device, facts = pick_device(args.device)
    report = {**facts, "stages": args.stages, "budget_s": args.budget_s, "complete": False, "rows": [],
              "stage_runs": []}
    if device is None:
        write_report(path, {**report, "error": "torch cannot use the GPU"})
        return ENVIRONMENT
    previous = signal.signal(signal.SIGTERM, terminated)  # killed from outside: the running stage's group too
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_check-"))
    try:
        return run_stages(args, device, out, work, path, report, started)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def terminated(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through run_stage's finally, which kills the child's group


def run_stages(args, device: str, out: Path, work: Path, path: Path, report: dict, started: float) -> int:
    for done, stage in enumerate(args.stages, 1):
        left = args.budget_s - (time.monotonic() - started)
        limit = args.stage_limit_s or (LIMITS_S[stage] if device == "cuda" else CPU_LIMIT_S)
        if left < MIN_START_S:
            rows = [failed_row(stage, f"runs within the budget of {args.budget_s:.0f} s",
                               f"not run: {max(left, 0):.0f} s of the budget left")]
            run = {"stage": stage, "limit_s": 0, "wall_s": 0, "returncode": None, "killed": False}
        else:
            print(f"[gpu-check] {stage} on {device} (limit {min(limit, left):.0f} s, {left:.0f} s of the budget left)",
                  flush=True)
            rows, run = run_stage(stage, device, work, min(limit, left))
        report["rows"] += rows
        report["stage_runs"].append(run)
        report["wall_s"] = time.monotonic() - started
        write_report(path, report)
        pack_stages(work, out, args.stages[:done])
    report["complete"] = True
    write_report(path, report)
    bad = [r for r in report["rows"] if r.get("status") not in ("ok", "skipped")]
    print(f"\n[gpu-check] {report['device']}, {report['wall_s']:.0f} s of {args.budget_s:.0f}; "
          f"{len(bad)} failed row(s); written to {path}")
    print_table(report["rows"])
    return FAILED if bad else OK


if __name__ == "__main__":
    sys.exit(main())
