"""One data-parallel training run of an EAGLE head on a tiny random target, for ``torchrun`` (the tests in
``test_distributed_training.py`` launch it): every rank trains, rank 0 saves the head's weights.

    torchrun --standalone --nproc_per_node=2 tests/ddp_script.py CORPUS OUT_DIR RESULT.safetensors
        [--crash-at STEP] [--skip-allreduce] [--epochs N]

``--crash-at``: rank 1 dies (``os._exit``) after that step, as a kill would; ``--skip-allreduce``: the broken
variant (each rank keeps its own gradients), the negative control of the equivalence test.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from eagle2.training.support import distributed  # noqa: E402


def ddp_cfg(epochs: int = 2):
    """The head settings of these runs: no feature noise (each rank draws its own) and fp32 (no autocast),
    so one process on the union batches is the exact reference."""
    from tests.test_training import head_cfg

    return head_cfg(epochs=epochs, noise=0.0, autocast="off", checkpoint_every=2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("result")
    ap.add_argument("--crash-at", type=int, default=None)
    ap.add_argument("--skip-allreduce", action="store_true")
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    distributed.init()
    if args.skip_allreduce:  # the broken variant: counts are summed, gradients stay each rank's own
        distributed.all_reduce_gradients = lambda params, positions, tokens: (positions, tokens)

    from safetensors.torch import save_file

    from eagle2.training.objectives.eagle import train_head
    from tests.test_training import tiny_target

    def crash(step, stats):
        if step == args.crash_at and distributed.rank() == 1:
            os._exit(1)

    head, _ = train_head(tiny_target(), args.corpus, ddp_cfg(args.epochs), args.out, on_step=crash)
    if distributed.is_main():
        save_file({k: v.contiguous() for k, v in head.state_dict().items() if "rotary" not in k}, args.result)
    distributed.close()


if __name__ == "__main__":
    main()
