"""How fast the host reads the programs of one workspace: every byte of output a program writes costs the host's
process reading, logging and relaying it, so a program that prints as fast as it can (``yes``) would take the host's
CPU from every other tenant. An :class:`OutputPace` shared by a workspace's programs says, after each chunk read,
how long their pipes wait before the next read; a program writing faster blocks on its full pipe meanwhile (the
kernel holds it back), and nothing it wrote is lost.
"""

from __future__ import annotations

import time

from ..errors import InvalidSpec

__all__ = ["OutputPace", "check_output_rate"]


def check_output_rate(rate: int | None) -> None:
    """Refuse an output rate a pace cannot take (``InvalidSpec``)."""
    if rate is not None and rate < 1:
        raise InvalidSpec(f"output_rate must be a positive number of bytes a second (or None), got {rate}")


class OutputPace:
    """A token bucket of bytes: ``rate`` bytes a second on average, in bursts of ``burst``."""

    def __init__(self, rate: int, burst: int | None = None) -> None:
        if rate < 1:
            raise ValueError(f"an output pace needs a positive rate, got {rate}")
        self.rate = rate
        self.burst = burst if burst is not None else rate
        self._allowance = float(self.burst)
        self._stamp = time.monotonic()

    def delay(self, nbytes: int) -> float:
        """Take ``nbytes`` just read; the seconds the reads wait before the next (0: none)."""
        now = time.monotonic()
        self._allowance = min(float(self.burst), self._allowance + (now - self._stamp) * self.rate) - nbytes
        self._stamp = now
        return 0.0 if self._allowance >= 0 else -self._allowance / self.rate
