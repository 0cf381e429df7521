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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...process.warmpool import WarmPool

__all__ = ["PoolSlot", "WarmPool", "container_pool"]


@dataclass(frozen=True, slots=True)
class PoolSlot:
    container_id: str
    host_dir: Path


def container_pool(size: int, make: Callable[[], PoolSlot], discard: Callable[[PoolSlot], None]) -> WarmPool[PoolSlot]:
    """Containers are created and removed by blocking daemon calls, all the missing ones at once in worker
    threads; an idle container is kept until the engine closes."""

    async def make_slot() -> PoolSlot:
        return await asyncio.to_thread(make)

    async def discard_slot(slot: PoolSlot) -> None:
        await asyncio.to_thread(discard, slot)

    return WarmPool(size, make_slot, discard_slot, starts_at_once=max(size, 1))
