"""Train drafters for a target (EAGLE heads, an SpS draft, Medusa heads) on corpora, then evaluate them.

    python train_head.py                          # the full SmolLM2 recipe (conf/train/smollm2.yaml)
    python train_head.py train=tiny stage=all     # a one-minute smoke run
    python train_head.py stage=list               # every stage: its place in all, its settings, what it makes
    python train_head.py stage=head               # one stage
    python train_head.py train=sharegpt stage=sharegpt      # ShareGPT token shards (a corpus source)
    python train_head.py train=sharegpt_joint stage=joint   # EAGLE + EAGLE-3 heads on one target forward per batch
    torchrun --standalone --nproc_per_node=8 train_head.py train=vicuna7b stage=head   # data-parallel training

The stages are the corpus sources and training objectives that ``eagle2/training/`` declares, and eval. Every
stage resumes: a corpus shard by shard, training from ``<out_dir>/checkpoint.pt``. Artifacts go to ``train.export``.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

import eagle2.bench  # noqa: F401  (registers what composing conf/ needs: the resolvers, the families' model keys)


@hydra.main(config_path="conf", config_name="train_head", version_base=None)
def main(cfg: DictConfig) -> None:
    import torch

    from eagle2.bench.models import load_target
    from eagle2.bench.validation import validate_process_settings
    from eagle2.training.loop import WorldSizeMismatch
    from eagle2.training.recipe import DATA_PARALLEL_STAGES, check_inputs, run_stages, stage_table, stages_of
    from eagle2.training.support import distributed
    from eagle2.training.support.warm_state import WarmStateError

    if cfg.stage == "list":
        print(stage_table())
        return
    root = Path(__file__).resolve().parent  # relative paths in the config are relative to the project
    try:  # a bad setting, an unknown stage, or a stage's missing or unreadable input: one line, before the target loads
        validate_process_settings(cfg)  # threads, model.dtype (as run.py checks them)
        stages = stages_of(cfg.stage)
        check_inputs(cfg, root, stages)
    except ValueError as exc:
        raise SystemExit(f"[train_head] {exc}") from None
    if distributed.launched() and set(stages) - set(DATA_PARALLEL_STAGES):
        raise SystemExit(f"[train_head] stage={cfg.stage} runs in one process (python train_head.py stage=...); "
                         f"under torchrun run one of: {', '.join(DATA_PARALLEL_STAGES)}")
    device = distributed.init()  # torchrun: join the process group (this rank's GPU on CUDA)
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    # (stock kernels: the losses backpropagate through its LM head)
    target, tokenizer = load_target(cfg.model, device=device, kernels="stock")
    try:
        run_stages(target, tokenizer, cfg, root, cfg.stage)
    except (WorldSizeMismatch, WarmStateError) as exc:  # (a warm state whose weights are not the init heads')
        raise SystemExit(f"[train_head] {exc}") from None
    finally:
        distributed.close()


if __name__ == "__main__":
    import sys

    from eagle2.bench.overrides import refuse_bad_overrides

    refuse_bad_overrides("train_head", sys.argv[1:])  # one line instead of Hydra's error and its HYDRA_FULL_ERROR hint
    main()
