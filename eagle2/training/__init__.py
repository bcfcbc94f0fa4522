"""Training the drafters, as a pipeline: ``corpora/`` (sources, each declaring ``SOURCE``) -> ``shards`` (token
and feature formats, dedup) -> ``features`` (offline and online taps of the target) -> ``data`` (sequences,
batches) -> ``objectives/`` (EAGLE, EAGLE-3, the SpS draft, Medusa, Hydra, the joint run; each declaring
``OBJECTIVE``) -> ``loop`` (fit, checkpoints) -> ``evaluation/`` (agreement, held-out measures and sets, the
eval stage); ``recipe`` reads the declarations into the stages of ``train_head.py``, checks their inputs and
runs them. ``support/`` holds what the steps share (losses, precision, exports, warm state, torchrun)."""
