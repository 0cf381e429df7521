"""A warm pool of started kernels, each handed to exactly one workspace.

A pooled kernel starts in a private staging directory (its own ``home``, ``tmp``, ``work`` and
log) with an environment built for that directory, never for a workspace. Taking it binds it to
one workspace: a silent cell that leaves no names behind moves it into the workspace's ``work/``
and replaces its whole environment; the staging directory is then deleted and the kernel's log
renamed into the workspace's ``runs/``. Nothing from the staging start is shared with anyone:
each kernel has its own staging directory and leaves the pool once, so two sessions never see
the same kernel. Staging directories live under the workspace root (same filesystem, so the log
rename keeps the kernel's open file) in ``.kernel-pool``, a name no workspace id can sanitise to.

Binding is ipykernel-specific (it runs Python), so the pool is only used for Python kernels.

Sandboxed kernels (:mod:`.sandboxpool`) use the same pool with other directories: each kernel is started
in a workspace slot (:mod:`execspace.workspace.slots`) that becomes the new workspace by a rename, so
they need no binding at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["KernelPool", "PooledKernel"]


@dataclass(slots=True)
class PooledKernel:
    kernel: Any
    """A :class:`~.local.ZmqConnection`; typed loosely to keep this module free of jupyter imports."""
    staging: Path
    since: float

    @property
    def host_dir(self) -> Path:
        """The kernel's directory (a :mod:`execspace.workspace.slots` slot for sandboxed kernels)."""
        return self.staging


Starter = Callable[[Path], Awaitable[Any]]
Stopper = Callable[[Any], Awaitable[None]]
MakeDir = Callable[[], Path]


class KernelPool:
    """Keeps ``size`` idle kernels started; stops them after ``idle_timeout`` seconds without a taker.

    Each kernel starts in a fresh directory from ``make_dir`` (run in a worker thread); ``dir``, if given,
    holds them all and is removed on close. :meth:`take` and :meth:`give_back` are safe from any thread
    (a workspace manager creates directories in worker threads); the rest runs on the event loop.
    """

    def __init__(
        self,
        dir: Path | None,
        size: int,
        idle_timeout: float,
        start: Starter,
        stop: Stopper,
        *,
        make_dir: MakeDir | None = None,
    ) -> None:
        self.size = size
        self.idle_timeout = idle_timeout
        self._dir = dir
        self._make_dir = make_dir or self._staging_dir
        self._start = start
        self._stop = stop
        self._lock = threading.Lock()
        self._idle: deque[PooledKernel] = deque()
        self._filler: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._closed = False
        self.last_error: str | None = None
        """Why the last pooled start failed (takers then start their kernel cold)."""

    def idle_kernels(self) -> list[Any]:
        """The kernels waiting in the pool (for tests and benchmarks: compare by identity or pid)."""
        with self._lock:
            return [p.kernel for p in self._idle]

    def take(self) -> PooledKernel | None:
        """An idle kernel for one workspace, or None (the caller starts one cold); the caller refills the pool
        once its kernel is bound, so that the refill's start-up does not compete with the binding."""
        with self._lock:
            return self._idle.popleft() if self._idle else None

    def give_back(self, pooled: PooledKernel) -> None:
        """Return a kernel that was taken but not used (its directory untouched)."""
        with self._lock:
            self._idle.appendleft(pooled)

    def _expired(self) -> PooledKernel | None:
        with self._lock:
            if self._idle and self._idle[0].since + self.idle_timeout <= time.monotonic():
                return self._idle.popleft()
            return None

    def _next_expiry(self) -> float | None:
        with self._lock:
            return self._idle[0].since + self.idle_timeout if self._idle else None

    def refill(self) -> None:
        """Top the pool up in the background (wakes the running filler, or starts one)."""
        if self.size <= 0 or self._closed:
            return
        self._ready.clear()
        if self._filler is not None and not self._filler.done():
            self._wake.set()
        else:
            self._filler = asyncio.get_running_loop().create_task(self._run())

    async def wait_ready(self, timeout: float = 30.0) -> bool:  # noqa: ASYNC109 - a convenience for callers
        """Wait until the pool holds ``size`` idle kernels (True) or gave up starting them (False)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout)
        return self._idle_count() >= self.size

    async def _run(self) -> None:
        """Fill, then sleep until a take wakes us or the oldest idle kernel expires; end when the pool is empty
        (all expired, or a start failed: no hot loop on a broken kernel spec; the next take starts a filler)."""
        while not self._closed:
            await self._fill()
            self._ready.set()
            while (expired := self._expired()) is not None:
                await self._discard(expired)
            expiry = self._next_expiry()
            if expiry is None or self._closed:
                return
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), expiry - time.monotonic())

    def _staging_dir(self) -> Path:
        assert self._dir is not None
        staging = self._dir / f"k-{os.getpid()}-{time.monotonic_ns()}"
        os.makedirs(staging, 0o700)
        return staging

    async def _fill(self) -> None:
        while self._idle_count() < self.size and not self._closed:
            staging: Path | None = None
            try:
                staging = await asyncio.to_thread(self._make_dir)
                kernel = await self._start(staging)
            except Exception as exc:  # takers start cold and fail loudly if the spec is broken
                self.last_error = f"{type(exc).__name__}: {exc}"
                if staging is not None:
                    await asyncio.to_thread(shutil.rmtree, staging, True)
                return
            with self._lock:
                self._idle.append(PooledKernel(kernel, staging, time.monotonic()))

    def _idle_count(self) -> int:
        with self._lock:
            return len(self._idle)

    async def _discard(self, pooled: PooledKernel) -> None:
        await self._stop(pooled.kernel)
        await asyncio.to_thread(shutil.rmtree, pooled.staging, True)

    async def aclose(self) -> None:
        """Stop the filler and every idle kernel. Idempotent."""
        self._closed = True
        self._wake.set()
        if self._filler is not None:
            # not cancelled: a kernel half-way through start-up or shutdown would leak its process; woken, the
            # filler returns after at most one start, whose kernel is stopped below with the other idle ones
            with contextlib.suppress(Exception):
                await self._filler
        while (pooled := self.take()) is not None:
            await self._discard(pooled)
        if self._dir is not None:
            await asyncio.to_thread(shutil.rmtree, self._dir, True)
