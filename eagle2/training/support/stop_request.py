"""A training run asked to stop (``kill -TERM``) ends at the next step boundary with its checkpoint written.

Legs of a long run end when their machine time ends. Killed mid-interval, a run would lose every step since its
last checkpoint (``checkpoint_every``: up to half an hour of a CPU's training); asked with SIGTERM it finishes the
step it is in, writes its checkpoint and returns as a partial run, which the same command resumes. A second
SIGTERM while the step finishes ends the process at once (the default action). With several ranks, a rank that
was asked stops them all at the same step (otherwise the next gradient reduction would wait forever).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

from eagle2.training.support import distributed


class StopRequest:
    """Set by SIGTERM while ``listening()``; ``agreed()`` reads it, across ranks."""

    def __init__(self):
        self.asked = False

    def _handler(self, signum, frame) -> None:
        self.asked = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second request ends the process at once

    @contextmanager
    def listening(self):
        """Catch SIGTERM in the main thread (elsewhere, or where it cannot be caught, nothing changes)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.signal(signal.SIGTERM, self._handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, previous)

    def agreed(self, world: int) -> bool:
        """Whether any rank was asked to stop (every rank gets the same answer)."""
        return any(distributed.all_gather_objects(self.asked)) if world > 1 else self.asked
