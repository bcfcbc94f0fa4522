"""Entry point: ``python run.py model=smollm2 method=eagle2 dataset=mt_bench`` (Hydra; ``-m`` sweeps)."""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from eagle2.runner import run

    run(cfg)


if __name__ == "__main__":
    main()
