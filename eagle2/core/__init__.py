"""The decoding round: propose -> verify -> accept -> commit (``engine``), the ``DraftTree`` contract
(``tree``), the acceptance rules (``accept``, ``sampling``), the target's KV cache (``cache``), feature
taps (``features``) and dtype resolution (``precision``). Imports no drafter, head or harness module."""
