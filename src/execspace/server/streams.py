"""Pacing long Connect streams: they end when their sandbox does, or at the client's ``Connect-Timeout-Ms``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from connectrpc.request import RequestContext

__all__ = ["deadline_of", "until_closed"]


def deadline_of(ctx: RequestContext[Any, Any]) -> float | None:
    """The loop time at which the client stops waiting (its ``Connect-Timeout-Ms``), or None."""
    timeout_ms = ctx.timeout_ms
    return None if timeout_ms is None else asyncio.get_running_loop().time() + timeout_ms / 1000


async def until_closed(closed: asyncio.Event, deadline: float | None, interval: float) -> AsyncIterator[None]:
    """Yield every ``interval`` seconds until ``closed`` is set or the deadline passes."""
    loop = asyncio.get_running_loop()
    while not closed.is_set():
        wait = interval if deadline is None else min(interval, deadline - loop.time())
        if wait <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(closed.wait(), wait)
        if closed.is_set():
            return
        yield
