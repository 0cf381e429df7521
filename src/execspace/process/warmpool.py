"""One warm pool for everything execspace starts ahead of need (containers, kernels, later sandbox sessions).

A pool keeps ``size`` items made by an async ``make`` and hands each out once (:meth:`WarmPool.take`). One
filler task per pool tops it up in the background (``starts_at_once`` makes at a time), then sleeps until a
take wakes it or the oldest idle item outlives ``idle_timeout``; it ends when nothing is left to watch. A
failed make is remembered in :attr:`WarmPool.last_error` and ends the round: no retry loop (a broken image
or kernel spec would spin), the next :meth:`WarmPool.refill` tries again, and takers meanwhile start cold.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["WarmPool"]

T = TypeVar("T")


@dataclass(slots=True)
class _Idle(Generic[T]):
    item: T
    since: float


class WarmPool(Generic[T]):
    """Keeps ``size`` items ready. :meth:`take`, :meth:`give_back`, :meth:`available` and :meth:`idle` are safe
    from any thread (workspace managers create directories in worker threads); the rest runs on the event loop.
    ``idle_timeout=None``: idle items are kept until :meth:`close`."""

    def __init__(
        self,
        size: int,
        make: Callable[[], Awaitable[T]],
        discard: Callable[[T], Awaitable[None]],
        *,
        idle_timeout: float | None = None,
        starts_at_once: int = 1,
    ) -> None:
        self.size = size
        self.idle_timeout = idle_timeout
        self._make = make
        self._discard = discard
        self._starts_at_once = max(starts_at_once, 1)
        self._lock = threading.Lock()
        self._idle: list[_Idle[T]] = []  # the next to hand out first
        self._filler: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._ready.set()  # nothing in flight
        self._wake = asyncio.Event()
        self._closed = False
        self.last_error: BaseException | None = None
        """Why the last make failed (shown by diagnostics; takers then start cold)."""

    def take(self) -> T | None:
        """An idle item for one user, or None (the caller starts one cold); the caller refills the pool."""
        with self._lock:
            return self._idle.pop(0).item if self._idle else None

    def give_back(self, item: T) -> None:
        """Return an item that was taken but not used."""
        with self._lock:
            self._idle.insert(0, _Idle(item, time.monotonic()))

    def available(self) -> int:
        with self._lock:
            return len(self._idle)

    def idle(self) -> list[T]:
        """The items waiting in the pool (for tests and benchmarks)."""
        with self._lock:
            return [i.item for i in self._idle]

    def refill(self) -> None:
        """Top the pool up in the background (wakes the running filler, or starts one)."""
        if self.size <= 0 or self._closed:
            return
        self._ready.clear()
        if self._filler is not None and not self._filler.done():
            self._wake.set()
        else:
            self._filler = asyncio.get_running_loop().create_task(self._run())

    async def ready(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 - a convenience for callers
        """Wait until the fill in flight is over (or ``timeout``); whether the pool now holds ``size`` items."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout)
        return self.available() >= self.size

    async def _run(self) -> None:
        try:
            while not self._closed:
                self._wake.clear()  # before filling: a take during the fill or the expiry is seen below
                await self._fill()
                self._ready.set()
                for expired in self._expired():
                    await self._discard(expired)
                expiry = self._next_expiry()
                if self._closed or (expiry is None and not self._wake.is_set()):
                    return
                timeout = None if expiry is None else max(expiry - time.monotonic(), 0.0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
        finally:
            self._ready.set()

    async def _fill(self) -> None:
        while not self._closed and (missing := self.size - self.available()) > 0:
            made = await asyncio.gather(
                *(self._make() for _ in range(min(missing, self._starts_at_once))), return_exceptions=True
            )
            failed: BaseException | None = None
            for result in made:
                if isinstance(result, BaseException):
                    failed = result
                else:
                    with self._lock:
                        self._idle.append(_Idle(result, time.monotonic()))
            if failed is not None:
                if not isinstance(failed, Exception):
                    raise failed
                self.last_error = failed
                return

    def _expired(self) -> list[T]:
        if self.idle_timeout is None:
            return []
        deadline = time.monotonic() - self.idle_timeout
        with self._lock:
            gone = [i.item for i in self._idle if i.since <= deadline]
            self._idle = [i for i in self._idle if i.since > deadline]
        return gone

    def _next_expiry(self) -> float | None:
        with self._lock:
            if self.idle_timeout is None or not self._idle:
                return None
            return min(i.since for i in self._idle) + self.idle_timeout

    async def close(self) -> None:
        """Stop the filler and discard every idle item. Idempotent."""
        self._closed = True
        self._wake.set()
        if self._filler is not None:
            # not cancelled: an item half-way through its start would leak (a kernel's process, a container);
            # woken, the filler returns after the makes in flight, whose items are discarded below
            with contextlib.suppress(Exception):
                await self._filler
        with self._lock:
            left, self._idle = [i.item for i in self._idle], []
        await asyncio.gather(*(self._discard(item) for item in left))
