"""Each sandbox's share of the server: what one tenant may hold at once, so that one at its caps leaves the others
a server that answers as if it were idle.

A sandbox's requests cost the server threads (every file operation walks or reads on one), descriptors (a live
command's pipes, an open stream's connection) and polling (a watcher walks its directory again and again). Its
share bounds each: file operations run at most ``file_ops`` at a time and ``file_time`` of one thread's time on
average (more wait, up to ``file_queue``; past that they are refused), and live commands, open streams and watchers
have caps of their own. A request over a cap is
refused at once with :class:`ShareExhausted`, which the routes answer as E2B does when it is too busy
(``RESOURCE_EXHAUSTED`` on Connect, 429 on HTTP; the SDK raises ``RateLimitException``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from ..errors import InvalidSpec

__all__ = ["BODY_UNIT", "Count", "SandboxShare", "ShareExhausted", "ShareLimits"]

#: Seconds of file work a sandbox may do at once before its share of the time applies.
_BURST = 1.0
#: Bytes of a body (a request's, a download's) that count as one request in its sandbox's pace.
BODY_UNIT = 256 * 1024


@dataclass(frozen=True, slots=True)
class ShareLimits:
    """What one sandbox may hold of the server at once."""

    file_ops: int = 2
    """File operations running at once (each on a thread of the server's)."""
    file_queue: int = 64
    """File operations waiting for one of those; more are refused."""
    file_time: float = 0.25
    """The share of one thread's time its file operations take on average: a sandbox that walked for a second
    waits three before its next operation starts (short ones never wait)."""
    programs: int = 128
    """Commands started through the API and not ended yet (each holds descriptors of the server's)."""
    streams: int = 128
    """Streaming responses open at once: command output, cells' output, directory watches, file transfers."""
    watchers: int = 16
    """Directory watchers, polled ones and streamed ones together (each walks its directory on every poll)."""
    requests_per_second: float = 500.0
    """Data-plane requests (envd's, the file API's, the code interpreter's) it makes on average, in bursts of as
    many, each 256 KiB of a request's body or of a download counting as one more: one past its pace waits for its
    turn (no CPU meanwhile, its body unread), and past ``request_queue`` waiting it is refused. 500 is 128 MiB/s of
    uploads."""
    request_queue: int = 256
    """Requests waiting for their turn at once."""
    output_rate: int = 32 * 1024 * 1024
    """Bytes a second the server reads of the output of its programs, all of them together: one that prints faster
    is held back by its full pipe (the engine's ``output_rate``, on the backends that have it)."""

    def __post_init__(self) -> None:
        for name, value in (
            ("file_ops", self.file_ops),
            ("programs", self.programs),
            ("streams", self.streams),
            ("watchers", self.watchers),
            ("requests_per_second", self.requests_per_second),
            ("output_rate", self.output_rate),
        ):
            if value < 1:
                raise InvalidSpec(f"ShareLimits.{name} must be at least 1, got {value}")
        if not 0 < self.file_time <= 1:
            raise InvalidSpec(f"ShareLimits.file_time must be in (0, 1], got {self.file_time}")
        if self.request_queue < 0:
            raise InvalidSpec(f"ShareLimits.request_queue must be 0 or more, got {self.request_queue}")
        if self.file_queue < 0:
            raise InvalidSpec(f"ShareLimits.file_queue must be 0 or more, got {self.file_queue}")


class ShareExhausted(Exception):
    """A sandbox asked for more of the server than its share: retry once something of it ended."""


class Count:
    """How many of one thing a sandbox holds, against its cap."""

    def __init__(self, cap: int, what: str) -> None:
        self.cap = cap
        self.what = what
        self.held = 0

    def take(self) -> None:
        if self.held >= self.cap:
            raise ShareExhausted(f"this sandbox has {self.cap} {self.what} already, its most; end one and retry")
        self.held += 1

    def give_back(self) -> None:
        self.held -= 1

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Hold one for the block."""
        self.take()
        try:
            yield
        finally:
            self.give_back()


class SandboxShare:
    """One sandbox's counters against its :class:`ShareLimits`."""

    def __init__(self, limits: ShareLimits) -> None:
        self.limits = limits
        self._files = asyncio.Semaphore(limits.file_ops)
        self._waiting = 0
        self._credit = _BURST
        """Seconds of file work it may do before it waits (negative: how far it is past its share)."""
        self._credited = time.monotonic()
        self._requests = float(limits.requests_per_second)
        """Requests it may make before it waits (negative: how many are waiting for their turn)."""
        self._requested = self._credited
        self._queued = 0
        self.programs = Count(limits.programs, "commands running")
        self.streams = Count(limits.streams, "open streams (command output, watches, file transfers)")
        self.watchers = Count(limits.watchers, "directory watchers")

    @contextlib.asynccontextmanager
    async def file_op(self) -> AsyncIterator[None]:
        """Hold one of the sandbox's file-operation slots for the block (waiting for one if need be)."""
        if self._files.locked() and self._waiting >= self.limits.file_queue:
            raise ShareExhausted(
                f"this sandbox has {self.limits.file_queue} file operations waiting already; retry when they are done"
            )
        self._waiting += 1
        try:
            await self._files.acquire()
            await self._within_share()
        except BaseException:
            self._files.release()
            raise
        finally:
            self._waiting -= 1
        began = time.monotonic()
        try:
            yield
        finally:
            self._credit -= time.monotonic() - began
            self._files.release()

    async def pace(self, units: float = 1.0, *, queued: bool = True) -> None:
        """Wait for the turn of the sandbox's next request, or of the next ``units`` of a body (at once within its
        pace). ``queued=False``: a piece of a request already admitted, which waits however many others do (its
        sender is held back meanwhile).

        Raises:
            ShareExhausted: ``request_queue`` requests of it are waiting already.
        """
        rate = self.limits.requests_per_second
        now = time.monotonic()
        self._requests = min(rate, self._requests + (now - self._requested) * rate)
        self._requested = now
        if self._requests >= units:
            self._requests -= units
            return
        if queued and self._queued >= self.limits.request_queue:
            raise ShareExhausted(
                f"this sandbox makes more than {rate:g} requests a second and has {self._queued} waiting: slow down"
            )
        self._requests -= units
        self._queued += 1
        try:
            await asyncio.sleep(-self._requests / rate)
        finally:
            self._queued -= 1

    async def _within_share(self) -> None:
        """Wait until the sandbox's file work is back within its share of the time."""
        now = time.monotonic()
        self._credit = min(_BURST, self._credit + (now - self._credited) * self.limits.file_time)
        self._credited = now
        if self._credit < 0:
            await asyncio.sleep(-self._credit / self.limits.file_time)
