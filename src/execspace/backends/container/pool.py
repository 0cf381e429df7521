"""A warm pool of started containers, each with its own empty workspace directory.

A bind mount's source is fixed when a container starts, so a pre-started container
cannot be pointed at a workspace created later. Each pool slot therefore gets its own
fresh, empty directory inside the workspace root (``.pool-<random>``, a name no
workspace can have), bind-mounted at ``/workspace``. Handing a slot to a new workspace
renames that directory to the workspace's name: the mount follows the directory, so the
container now sees the workspace. The rename is atomic and on one filesystem, and it
only happens when the workspace directory does not exist yet, so a slot always starts
clean (nothing ever ran in it) and belongs to exactly one workspace; a slot is never
returned to the pool once handed out.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...workspace.slots import adopt_slot_dir

__all__ = ["PoolSlot", "WarmPool", "adopt_slot_dir"]


@dataclass(frozen=True, slots=True)
class PoolSlot:
    container_id: str
    host_dir: Path


class WarmPool:
    """Keeps ``size`` started containers ready; :meth:`take` is safe from any thread."""

    def __init__(self, size: int, make: Callable[[], PoolSlot], discard: Callable[[PoolSlot], None]) -> None:
        self.size = size
        self._make = make
        self._discard = discard
        self._ready: deque[PoolSlot] = deque()
        self._lock = threading.Lock()
        self._fills: set[asyncio.Future[PoolSlot]] = set()
        self._closed = False
        self.last_error: BaseException | None = None
        """Why the last fill failed (shown by diagnostics; the pool retries on the next take)."""

    def take(self) -> PoolSlot | None:
        with self._lock:
            return self._ready.popleft() if self._ready else None

    def give_back(self, slot: PoolSlot) -> None:
        """Return a slot that was taken but not used (its directory untouched)."""
        with self._lock:
            self._ready.appendleft(slot)

    def available(self) -> int:
        with self._lock:
            return len(self._ready)

    def refill(self) -> None:
        """Start creating the missing containers in the background (call on the event loop)."""
        if self._closed:
            return
        missing = self.size - self.available() - len(self._fills)
        for _ in range(max(missing, 0)):
            fill = asyncio.ensure_future(asyncio.to_thread(self._make))
            self._fills.add(fill)
            fill.add_done_callback(self._filled)

    def _filled(self, fill: asyncio.Future[PoolSlot]) -> None:
        self._fills.discard(fill)
        if fill.cancelled():
            return
        exc = fill.exception()
        if exc is not None:
            self.last_error = exc  # no retry loop here: a broken image would spin
            return
        with self._lock:
            self._ready.append(fill.result())

    async def ready(self) -> None:
        """Wait for the fills in flight (the pool is full afterwards unless one failed)."""
        while self._fills:
            await asyncio.gather(*self._fills, return_exceptions=True)
            await asyncio.sleep(0)  # let the done callbacks run

    async def close(self) -> None:
        self._closed = True
        await self.ready()
        with self._lock:
            slots, self._ready = list(self._ready), deque()
        await asyncio.gather(*(asyncio.to_thread(self._discard, s) for s in slots))
