"""Run a named experiment end to end: its sweep, then the report.

    python -m experiments.research.recipe table1                      # CPU, SmolLM2, small
    python -m experiments.research.recipe table1 model=vicuna7b       # the GPU recipe
    python -m experiments.research.recipe tree_budget hydra/launcher=slurm hydra.launcher.partition=gpu

NAME is one of conf/experiment/*.yaml; every other argument is a Hydra override handed to
``python run.py -m experiment=NAME``. tree_budget also runs its plain baseline (plain decoding has no tree
settings, so it cannot share the grid); equal_budgets also runs its 60-node pair (a static tree of
60 nodes, the first 60 of ``model.mc_sim_7b_63``, against EAGLE-2 at total_tokens=60): each
experiment lists such runs as ``extra_runs`` in its YAML.
The report of ``results/NAME`` goes to ``report/NAME``. Finished
rows are never redone, so the same command resumes a killed sweep.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml") if not p.stem.startswith("_"))


def extra_runs(name: str) -> list[list[str]]:
    """The experiment's ``extra_runs`` (``conf/experiment/NAME.yaml``): more sweeps, each a list of overrides,
    kept as written (an interpolation in one resolves when ``run.py`` composes that run)."""
    from omegaconf import OmegaConf

    experiment = OmegaConf.load(ROOT / "conf" / "experiment" / f"{name}.yaml")
    return [[str(o) for o in run] for run in OmegaConf.to_container(experiment, resolve=False).get("extra_runs", [])]


def commands(name: str, overrides: list[str], results: str | None, report: str | None) -> list[list[str]]:
    """The shell commands of a recipe, in order (``results`` None: the experiment's own folder)."""
    extra = [*overrides, *([f"paths.results={results}"] if results else [])]
    sweep = [sys.executable, "run.py", "-m", f"experiment={name}"]
    out = [sweep + extra]
    out += [sweep + more + extra for more in extra_runs(name)]
    if report:
        out.append([sys.executable, "-m", "analysis.report", results or f"results/{name}", "--out", report])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.research.recipe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", choices=EXPERIMENTS)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=vicuna7b dataset.limit=10")
    ap.add_argument("--results", help="results folder (default: the experiment's, results/NAME)")
    ap.add_argument("--report", help="report folder (default: report/NAME)")
    ap.add_argument("--no-report", action="store_true", help="run the sweep only")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and stop")
    args = ap.parse_args(argv)
    report = None if args.no_report else (args.report or f"report/{args.name}")
    status = 0
    for cmd in commands(args.name, args.overrides, args.results, report):
        print("+", " ".join(["python", *cmd[1:]] if cmd[0] == sys.executable else cmd), flush=True)
        if not args.dry_run:
            status = subprocess.run(cmd, cwd=ROOT).returncode or status
    return status


if __name__ == "__main__":
    sys.exit(main())
