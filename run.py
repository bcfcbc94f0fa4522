"""Entry point: ``python run.py model=smollm2 method=eagle2 dataset=mt_bench`` (Hydra; ``-m`` sweeps).

A run that fails as a whole (a missing EAGLE head, out of memory while loading) is recorded in the
results store as a failed cell. In a sweep (``-m``) the sweep then goes on to the next cell; a single
run exits non-zero with one line naming the error.
"""

import eagle2  # noqa: I001  (first: on a bare GPU node it makes `make gpu-env`'s hydra and omegaconf importable)
import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

import eagle2.bench  # noqa: F401  (registers the config resolvers: device_type, first_set)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from eagle2.bench.runner import record_cell_failure, run

    try:
        run(cfg)
    except Exception as exc:
        where = record_cell_failure(cfg, exc)
        stored = f"not recorded: {where[len('nowhere: '):]}" if where.startswith("nowhere") else f"recorded in {where}"
        message = f"[eagle2] run failed: {type(exc).__name__}: {exc} ({stored})"
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            raise SystemExit(message) from exc
        print(message + "; the sweep goes on", flush=True)


if __name__ == "__main__":
    main()
