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

Sandboxed kernels (:mod:`.sandboxpool`) use the same pool with other directories (both are a
:class:`~execspace.process.warmpool.WarmPool`): each kernel is started
in a workspace slot (:mod:`execspace.workspace.slots`) that becomes the new workspace by a rename, so
they need no binding at all.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...process.warmpool import WarmPool

__all__ = ["KernelPool", "PooledKernel"]


@dataclass(slots=True)
class PooledKernel:
    kernel: Any
    """A :class:`~.local.ZmqConnection`; typed loosely to keep this module free of jupyter imports."""
    staging: Path

    @property
    def host_dir(self) -> Path:
        """The kernel's directory (a :mod:`execspace.workspace.slots` slot for sandboxed kernels)."""
        return self.staging


Starter = Callable[[Path], Awaitable[Any]]
Stopper = Callable[[Any], Awaitable[None]]
MakeDir = Callable[[], Path]


class KernelPool(WarmPool[PooledKernel]):
    """Keeps ``size`` idle kernels started, one at a time; stops them after ``idle_timeout`` seconds without a
    taker.

    Each kernel starts in a fresh directory from ``make_dir`` (run in a worker thread), removed with it;
    ``dir``, if given, holds them all and is removed on close.
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
        super().__init__(size, self._start_in_dir, self._stop_and_remove, idle_timeout=idle_timeout)
        self._dir = dir
        self._make_dir = make_dir or self._staging_dir
        self._start = start
        self._stop = stop

    def idle_kernels(self) -> list[Any]:
        """The kernels waiting in the pool (for tests and benchmarks: compare by identity or pid)."""
        return [p.kernel for p in self.idle()]

    async def wait_ready(self, timeout: float = 30.0) -> bool:  # noqa: ASYNC109 - a convenience for callers
        """Wait until the pool holds ``size`` idle kernels (True) or gave up starting them (False)."""
        return await self.ready(timeout)

    def _staging_dir(self) -> Path:
        assert self._dir is not None
        staging = self._dir / f"k-{os.getpid()}-{time.monotonic_ns()}"
        os.makedirs(staging, 0o700)
        return staging

    async def _start_in_dir(self) -> PooledKernel:
        staging = await asyncio.to_thread(self._make_dir)
        try:
            return PooledKernel(await self._start(staging), staging)
        except BaseException:  # takers start cold and fail loudly if the spec is broken
            await asyncio.to_thread(shutil.rmtree, staging, True)
            raise

    async def _stop_and_remove(self, pooled: PooledKernel) -> None:
        await self._stop(pooled.kernel)
        await asyncio.to_thread(shutil.rmtree, pooled.staging, True)

    async def aclose(self) -> None:
        """Stop the filler and every idle kernel. Idempotent."""
        await self.close()
        if self._dir is not None:
            await asyncio.to_thread(shutil.rmtree, self._dir, True)
