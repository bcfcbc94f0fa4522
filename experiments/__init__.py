"""What runs on top of the library, in three rooms: ``bench`` (speed benchmarks, ``make bench-*``),
``research`` (named experiments, ablations and studies) and ``ops`` (the GPU check)."""
