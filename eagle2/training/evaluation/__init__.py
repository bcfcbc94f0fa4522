"""Evaluation, in one place: ``agreement`` (the one definition of top-k agreement and accepted lengths that
losses, validation and the eval stage share), ``evaluate`` (teacher-forced and greedy-chain measures of a
drafter), ``heldout`` (the held-out sets a run validates on, MT-bench first turns the headline one) and
``stage`` (``train_head.py stage=eval``: every exported drafter measured on them)."""
