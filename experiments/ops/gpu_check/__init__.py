"""``make gpu-check``: is a GPU node ready for the paper's runs? (standard library only here: ``env`` must
import under a bare ``python3`` before anything is installed).

- ``env``: the launcher ``make gpu-check`` runs first (no GPU: nothing to check; the bundle; packages; CUDA).
- ``check``: the orchestrator (``python -m experiments.ops.gpu_check``): each stage in a child process with a
  time limit, at most ``check.MAX_FILES`` files in its output folder.
- ``stages``: the stages and their pass criteria; ``models``: the random-weight models at the real shapes.
"""
