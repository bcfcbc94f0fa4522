"""Training the drafters, as a pipeline: ``corpora/`` (sources) -> ``shards`` (token and feature formats,
dedup) -> ``features`` (offline and online taps of the target) -> ``data`` (sequences, batches) ->
``objectives/`` (EAGLE, EAGLE-3, the SpS draft, Medusa, the joint run; one interface) -> ``loop`` (fit,
checkpoints) -> ``evaluate`` (held-out measures); ``recipe`` runs the stages of ``train_head.py``."""
