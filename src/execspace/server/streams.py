"""Long responses: Connect streams paced until their sandbox ends or the client's ``Connect-Timeout-Ms``, and HTTP
streams counted in their sandbox's share while they are answered."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from connectrpc.request import RequestContext
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from .shares import Count

__all__ = ["CountedStream", "deadline_of", "until_closed"]


class CountedStream(StreamingResponse):
    """A streamed answer (a cell's lines, a download) that holds one of its sandbox's streams, taken before, until
    it is answered or its client left."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        count: Count,
        *,
        media_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self._count = count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._count.give_back()


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
