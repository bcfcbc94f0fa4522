"""Speed benchmarks: what ``make bench-*`` runs. Each times one thing against a reference on this machine
(our engine against transformers' ``generate()``, SpS against assisted generation, batched against batch 1,
the cache and kernels, a head's training step, streaming features) and prints a stamped table; none writes
result rows. Belongs here: a timing comparison with its reference, run by a ``make bench-*`` target."""
