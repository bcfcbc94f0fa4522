"""Entry point: ``python run.py model=smollm2 method=eagle2 dataset=mt_bench`` (Hydra; ``-m`` sweeps).

A run that fails as a whole (out of memory while loading) is recorded in the results store as a failed
cell; a config refused by the checks before loading records nothing. A run whose turns failed (stored as
failed rows) ends with one line counting them. In a sweep (``-m``) the sweep then goes on to the next
cell; a single run exits non-zero with that line.
"""

import eagle2  # noqa: I001  (first: on a bare GPU node it makes `make gpu-env`'s hydra and omegaconf importable)
import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

import eagle2.bench  # noqa: F401  (registers what composing conf/ needs: the resolvers, the families' model keys)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from eagle2.bench.runner import record_cell_failure, run

    try:
        summary = run(cfg)
    except Exception as exc:
        where = record_cell_failure(cfg, exc)
        stored = f"not recorded: {where[len('nowhere: '):]}" if where.startswith("nowhere") else f"recorded in {where}"
        _stop(f"[eagle2] run failed: {type(exc).__name__}: {exc} ({stored})", exc)
        return
    if summary.get("failed_turns"):
        _stop(f"[eagle2] {summary['failed_turns']} turn(s) failed (first: {summary['first_failure']}); stored as "
              f"failed rows in {summary['results']}, a rerun retries them")


def _stop(message: str, exc: BaseException | None = None) -> None:
    """A single run exits non-zero with ``message``; a sweep prints it and goes on to its next cell."""
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        raise SystemExit(message) from exc
    print(message + "; the sweep goes on", flush=True)


if __name__ == "__main__":
    import sys

    from eagle2.bench.overrides import refuse_bad_overrides

    refuse_bad_overrides("config", sys.argv[1:])  # one line instead of Hydra's error and its HYDRA_FULL_ERROR hint
    main()
