"""A sandbox's requests as its idleness sees them (:mod:`.idle`): how many are being served now (a stream counts
for as long as it is open: a command's output, a cell's lines, a transfer, a watch), and when the last one ended."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

__all__ = ["Activity"]


class Activity:
    """The requests of one sandbox that its caller was entitled to (an anonymous ``/health`` only looks)."""

    def __init__(self) -> None:
        self.serving = 0
        """Requests being answered now, streams included."""
        self.served = 0
        """Requests begun so far: a change says one came (see :meth:`quiet_since`)."""
        self._ended = time.monotonic()

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """Count the block as one request of the sandbox."""
        self.serving += 1
        self.served += 1
        try:
            yield
        finally:
            self.serving -= 1
            self._ended = time.monotonic()

    def quiet_since(self, now: float) -> float:
        """Since when (``time.monotonic``) no request of it has been open: ``now`` while one is."""
        return now if self.serving else self._ended
