"""Drafters: each turns the committed context into a ``DraftTree`` (the interface: ``eagle2.drafters.base``),
one module per method, with their helpers (``lookup``: n-gram chains; ``budget``: EAGLE-2's per-round
budget from a cost profile the harness measured, ``eagle2.bench.cost_profile``). A drafter imports ``core``
and ``heads`` only; the harness picks one through its method registry (``eagle2.bench.methods.build_drafter``), and the
engine never knows which one it runs.
"""
