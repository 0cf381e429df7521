"""What the code interpreter's process contexts (a Node REPL, a bash, an R, a JVM) share: a program of the sandbox's
session that takes cells on its stdin and whose output, read as it comes, is parsed into items that one cell at a
time consumes.

Everything the process writes is the program's output, so it is untrusted input; output is never held up: a
client that falls more than :data:`MAX_AHEAD` bytes behind a cell loses the excess of its stdout/stderr (a note at
the cell's end says how much), never the items that end a cell, and never the context.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from ..models import OutputChunk
from ..protocols import ProgramHandle
from .lines import CellTimedOut, error_line, paced

__all__ = ["MAX_AHEAD", "CellProcess", "now"]

T = TypeVar("T")

#: Bytes of output read ahead of a client that reads slower than the cell writes; beyond, output is dropped.
MAX_AHEAD = 32 * 1024 * 1024


def now() -> str:
    return datetime.now(UTC).isoformat()


class CellProcess(Generic[T]):
    """A started context process and the items parsed from its output. Subclasses say how a cell is sent
    (:meth:`_request`), how output is parsed (:meth:`_feed`) and what an item means to a cell (:meth:`_lines`)."""

    DIED = "the context's process ended; the next cell starts a fresh one (state is lost)"

    def __init__(self, handle: ProgramHandle, end: T) -> None:
        """``end``: the item :meth:`_receive` gives once the process's output ended."""
        self.handle = handle
        self._end = end
        self._items: asyncio.Queue[tuple[T, int] | None] = asyncio.Queue()
        self._ahead = 0
        """Bytes of the items waiting in ``_items``."""
        self._dropped = 0
        """Bytes of output dropped since the last cell's end (see MAX_AHEAD)."""
        self._lost: str | None = None
        """Why its output stopped coming, when the process may still run (a reader that fell behind)."""
        self.ended = False
        """Set by a cell that found the process gone or stuck: it must be replaced."""
        self._pump = asyncio.create_task(self._read(handle.attach(from_start=True)))
        # a waiter lets the output flow to the attached reader: unwaited, the handle holds it for stream()
        self._waiter = asyncio.ensure_future(handle.wait())
        self._waiter.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def cell(
        self,
        code: str,
        env_vars: Mapping[str, str],
        timeout: float | None,  # noqa: ASYNC109 - interrupts the cell, not our task
        closed: asyncio.Event,
        keepalive: float,
        grace: float,
    ) -> AsyncIterator[dict[str, Any]]:
        """E2B's lines of one cell, up to (not including) ``end_of_execution``; ``self.ended`` afterwards says the
        process is gone or stuck, and must be replaced."""
        cell_id = secrets.token_hex(8)
        if not await self._send(self._request(cell_id, code, env_vars)):
            yield error_line("KernelDied", self.DIED)
            return
        try:
            async for item in paced(self._receive, self.interrupt, timeout, closed, keepalive=keepalive, grace=grace):
                if item is None:
                    yield {"type": "keepalive"}
                    continue
                if item is self._end:
                    self.ended = True
                    yield self._end_line()
                    return
                lines, done = self._lines(cell_id, item)
                for line in lines:
                    yield line
                if done:
                    if (note := self._dropped_note()) is not None:
                        yield note
                    for line in self._closing_lines():
                        yield line
                    return
        except CellTimedOut as exc:
            self.ended = True
            yield error_line("TimeoutError", str(exc))

    def _request(self, cell_id: str, code: str, env_vars: Mapping[str, str]) -> bytes:
        """What starts the cell in the process (and resets what a cell keeps of its own)."""
        raise NotImplementedError

    def _lines(self, cell_id: str, item: T) -> tuple[list[dict[str, Any]], bool]:
        """The E2B lines of an item for the running cell ``cell_id``, and whether the cell ended with it."""
        raise NotImplementedError

    def _closing_lines(self) -> list[dict[str, Any]]:
        """Lines of a cell that ended, after its output (none by default)."""
        return []

    def _end_line(self) -> dict[str, Any]:
        if self._lost is not None:
            why = f"the cell's output outran its reader ({self._lost}); the context is restarted: state lost"
            return error_line("OutputOverflow", why)
        return error_line("KernelDied", self.DIED)

    async def stop(self) -> None:
        self._pump.cancel()
        with contextlib.suppress(Exception):
            await self.handle.kill()
        for task in (self._pump, self._waiter):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task

    async def interrupt(self) -> None:
        with contextlib.suppress(Exception):
            await self.handle.signal(signal.SIGINT)

    async def _send(self, request: bytes) -> bool:
        """Write a cell to the process; False (and ``ended``) if its stdin is gone, and so the process."""
        try:
            await self.handle.write_stdin(request)
        except Exception:
            self.ended = True
            return False
        return True

    async def _receive(self, wait: float) -> T | None:
        """The next item (the ``end`` one once the output ended), or None if none came within ``wait``."""
        try:
            found = await asyncio.wait_for(self._items.get(), wait)
        except TimeoutError:
            return None
        if found is None:
            return self._end
        item, size = found
        self._ahead -= size
        return item

    def _put(self, item: T, size: int, *, output: bool) -> None:
        """Queue an item of ``size`` bytes; ``output`` (plain stdout/stderr) is dropped past MAX_AHEAD."""
        if output and self._ahead + size > MAX_AHEAD:
            self._dropped += size
            return
        self._ahead += size
        self._items.put_nowait((item, size))

    def _dropped_note(self) -> dict[str, Any] | None:
        """The stderr line saying how much output the last cell lost, if any."""
        dropped, self._dropped = self._dropped, 0
        if not dropped:
            return None
        note = f"[execspace: {dropped} bytes of output dropped: the client fell {MAX_AHEAD} bytes behind]\n"
        return {"type": "stderr", "text": note, "timestamp": now()}

    async def _read(self, chunks: AsyncIterator[OutputChunk]) -> None:
        try:
            async for chunk in chunks:
                self._feed(chunk.stream, chunk.data)
        except Exception as exc:  # the output ended either way: the consumer learns why from _lost
            self._lost = str(exc)
        self._flush()
        self._items.put_nowait(None)

    def _feed(self, stream: str, data: bytes) -> None:
        """Parse more of the process's ``stream`` into items (:meth:`_put`)."""
        raise NotImplementedError

    def _flush(self) -> None:
        """Put what is left once the output ended."""
        raise NotImplementedError
