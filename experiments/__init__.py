"""Named experiments: thin recipes over ``run.py`` sweeps and benchmarks, one per table or figure."""
