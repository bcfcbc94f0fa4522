"""Is this machine ready for ``make gpu-check``? The launcher that runs first there, standard library only
(it must run under a bare ``python3`` on any machine, before anything is installed).

In this order:

1. **No NVIDIA GPU** (no ``nvidia-smi`` on the PATH that lists one, no ``/dev/nvidia0``): says
   "nothing to check" and exits 0 (a CPU machine, CI).
2. **The bundle** (optional): the pure-Python wheels that ``make gpu-bundle`` downloaded here into
   ``.gpu_bundle/`` (omegaconf, hydra-core, antlr4: absent from the GPU image, which has no registry;
   run.py needs them, the check does not) are installed offline into ``.gpu_site/`` (``pip install
   --no-index --no-deps --target``); a wheel of torch, transformers, triton or an NVIDIA library is
   refused (exit 4): the machine's own CUDA build of torch must never be replaced.
3. **Packages**: every module the check imports (``NEEDED``: torch, transformers, safetensors, numpy,
   pyyaml; all on the GPU image) must be importable with ``.gpu_site`` on the path; a missing one exits
   3, naming it. Those only the runs after the check need (``FOR_RUNS``: omegaconf, hydra-core, antlr4
   for run.py, sentencepiece for Vicuna's and LLaMA-2's tokenizers) are named when missing, with how to
   get them, and the check goes on.
4. **torch sees the GPU**: a GPU is present but torch is a CPU build, or CUDA cannot initialise:
   exit 2 (a CPU torch would silently hide the GPU and time the CPU).
5. Then it runs ``python -m experiments.ops.gpu_check ARGS`` with that same interpreter (``os.execve``:
   its exit status is the check's).

``EAGLE2_NVIDIA_DEVICE`` names the device node looked for (default ``/dev/nvidia0``), so tests can
fake a GPU machine (tests/test_gpu_env.py, with a fake ``nvidia-smi`` on the PATH).

    python3 -m experiments.ops.gpu_check.env [--bundle .gpu_bundle] [--site .gpu_site] [--python P]
        [--prepare-only] -- ARGS
    python3 -m experiments.ops.gpu_check.env --for-runs    # make gpu-env: only the bundle, for run.py afterwards
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# import name -> distribution: what experiments.ops.gpu_check and its stages import (all on the GPU image)
NEEDED = {"torch": "torch", "transformers": "transformers", "safetensors": "safetensors", "numpy": "numpy",
          "yaml": "pyyaml"}
# what the runs after the check need (run.py, eagle2.identity) and the GPU image lacks: carried as wheels
# by `make gpu-bundle`; missing ones are named, not fatal (the check itself needs none of them)
FOR_RUNS = {"omegaconf": "omegaconf", "hydra": "hydra-core", "antlr4": "antlr4-python3-runtime",
            "sentencepiece": "sentencepiece"}  # Vicuna's and LLaMA-2's tokenizer (pyproject's gpu extra)
REFUSED_WHEELS = ("torch", "transformers", "triton", "nvidia")  # never reinstalled from a bundle

NO_GPU, NO_CUDA_TORCH, MISSING, BAD_BUNDLE = 0, 2, 3, 4


def nvidia_gpus() -> list[str]:
    """What says an NVIDIA GPU is here: ``nvidia-smi -L`` lines, or the device node."""
    found = []
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
            found += [line.strip() for line in out.splitlines() if line.startswith("GPU")]
        except (OSError, subprocess.SubprocessError):
            pass
    node = os.environ.get("EAGLE2_NVIDIA_DEVICE", "/dev/nvidia0")
    if not found and os.path.exists(node):
        found.append(f"device node {node}")
    return found


def refused(wheel: Path) -> bool:
    """A wheel of torch (or torchvision, ...), transformers, triton or an NVIDIA library."""
    return wheel.name.lower().startswith(REFUSED_WHEELS)


def install_bundle(bundle: Path, site: Path, python: str = sys.executable) -> list[str]:
    """Install the bundle's wheels offline into ``site``; returns their names. Raises SystemExit(4) on
    a refused wheel or a failed install."""
    wheels = sorted(bundle.glob("*.whl")) if bundle.is_dir() else []
    if not wheels:
        return []
    bad = [w.name for w in wheels if refused(w)]
    if bad:
        print(f"[gpu-env] refusing {', '.join(bad)} in {bundle}: the machine's own torch/transformers/CUDA "
              "libraries are used as they are; remove them and run make gpu-bundle", file=sys.stderr)
        raise SystemExit(BAD_BUNDLE)
    cmd = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--disable-pip-version-check", "--upgrade", "--target", str(site), *map(str, wheels)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        print(f"[gpu-env] installing {bundle} into {site} failed:\n{done.stdout}{done.stderr}", file=sys.stderr)
        raise SystemExit(BAD_BUNDLE)
    return [w.name for w in wheels]


def with_site(site: Path) -> dict:
    """The environment with ``site`` first on PYTHONPATH (and the repository, for ``-m experiments``)."""
    paths = [str(site), str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def missing_modules(env: dict, python: str = sys.executable, modules=None) -> list[str]:
    """The ``modules`` (default NEEDED) that ``python`` cannot find under ``env`` (found, not imported: fast)."""
    modules = list(NEEDED if modules is None else modules)
    probe = ("import importlib.util, sys\n"
             "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))")
    try:
        out = subprocess.run([python, "-c", probe, *modules], capture_output=True, text=True, env=env, timeout=120)
    except OSError as exc:
        raise SystemExit(f"[gpu-env] cannot run {python}: {exc}") from None
    if out.returncode:
        return modules  # the interpreter itself failed: nothing can be relied on
    return out.stdout.split()


def torch_cuda(env: dict, python: str = sys.executable) -> tuple[bool, str]:
    """(CUDA usable, what torch says) in a child process: this module never imports torch."""
    probe = ("import torch\n"
             "ok = torch.version.cuda is not None and torch.cuda.is_available()\n"
             "name = torch.cuda.get_device_name(0) if ok else ''\n"
             "print(int(ok), torch.__version__, torch.version.cuda, name)")
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    if done.returncode:
        return False, (done.stderr.strip().splitlines() or ["torch failed to import"])[-1]
    ok, *facts = done.stdout.split(maxsplit=3)
    return ok == "1", " ".join(facts)


def prepare(bundle: Path, site: Path, python: str = sys.executable) -> dict:
    """Steps 1-4 for the interpreter ``python``; returns the environment to run the check in, or raises
    SystemExit with the code."""
    gpus = nvidia_gpus()
    if not gpus:
        print("[gpu-env] no NVIDIA GPU on this machine (no nvidia-smi listing one, no "
              f"{os.environ.get('EAGLE2_NVIDIA_DEVICE', '/dev/nvidia0')}): nothing to check. "
              "The CPU half: make gpu-check CPU_HALF=1", flush=True)
        raise SystemExit(NO_GPU)
    print(f"[gpu-env] {'; '.join(gpus)}", flush=True)
    installed = install_bundle(bundle, site, python)
    if installed:
        print(f"[gpu-env] installed offline into {site}: {', '.join(installed)}", flush=True)
    env = with_site(site)
    missing = missing_modules(env, python)
    if missing:
        print(f"[gpu-env] missing on this machine: {', '.join(NEEDED[m] for m in missing)}; the check needs "
              "them and they must come with the machine's image (or as wheels in the bundle)", file=sys.stderr)
        raise SystemExit(MISSING)
    for_runs = missing_modules(env, python, FOR_RUNS)
    if for_runs:
        print(f"[gpu-env] note: {', '.join(FOR_RUNS[m] for m in for_runs)} missing: the check runs without them, "
              f"run.py does not; `make gpu-bundle` where pip works and copy {bundle}/ to this node (sentencepiece, "
              "compiled: a wheel for this node's Python, or pip install -e '.[gpu]')", flush=True)
    ok, facts = torch_cuda(env, python)
    if not ok:
        print(f"[gpu-env] an NVIDIA GPU is here but torch cannot use it ({facts}): a CPU build of torch, or "
              "CUDA failed to initialise. Use the machine's own CUDA torch (make gpu-check GPU_PYTHON=...); "
              "never pip-install torch over it.", file=sys.stderr)
        raise SystemExit(NO_CUDA_TORCH)
    print(f"[gpu-env] torch {facts}", flush=True)
    return env


RUN_IMPORTS = ("omegaconf", "hydra", "antlr4")  # the bundled packages run.py imports


def prepare_for_runs(bundle: Path, site: Path, python: str = sys.executable) -> int:
    """``make gpu-env``: the bundle installed into ``site`` (GPU or not), then omegaconf, hydra and antlr4
    must import from there; run.py, ``python -m analysis.report`` and ``python -m eagle2.identity`` put
    ``.gpu_site`` on their path themselves (``eagle2/__init__.py``). 0, or 3 naming what is still missing."""
    installed = install_bundle(bundle, site, python)
    if installed:
        print(f"[gpu-env] installed offline into {site}: {', '.join(installed)}", flush=True)
    missing = missing_modules(with_site(site), python, RUN_IMPORTS)
    if missing:
        print(f"[gpu-env] {', '.join(FOR_RUNS[m] for m in missing)} missing from this Python and from {site}: "
              f"run `make gpu-bundle` where pip works and copy {bundle}/ here", file=sys.stderr)
        return MISSING
    print(f"[gpu-env] run.py, python -m analysis.report and python -m eagle2.identity import "
          f"{', '.join(FOR_RUNS[m] for m in RUN_IMPORTS)} from this Python or {site}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(prog="python3 -m experiments.ops.gpu_check.env", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=ROOT / ".gpu_bundle", help="wheels from make gpu-bundle")
    ap.add_argument("--site", type=Path, default=ROOT / ".gpu_site", help="where they are installed")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that runs the check (default: this one)")
    ap.add_argument("--prepare-only", action="store_true", help="stop before running the check")
    ap.add_argument("--for-runs", action="store_true",
                    help="only install the bundle into --site for run.py and the reports (make gpu-env), GPU or not")
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    args.python = shutil.which(args.python) or args.python
    if args.for_runs:
        try:
            return prepare_for_runs(args.bundle, args.site, args.python)
        except SystemExit as exc:
            return int(exc.code) if isinstance(exc.code, int) else MISSING
    try:
        env = prepare(args.bundle, args.site, args.python)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return MISSING
        return int(exc.code or 0)
    if args.prepare_only:
        return 0
    sys.stdout.flush()
    os.execve(args.python, [args.python, "-m", "experiments.ops.gpu_check", *rest], env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
