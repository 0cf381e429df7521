"""The output lines of E2B's ``/execute`` stream that every kind of context makes alike, and the pace of a cell:
its deadline, its interrupt, the keepalives of a quiet one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["RESULT_FIELDS", "CellTimedOut", "error_line", "paced", "result_line"]

T = TypeVar("T")


class CellTimedOut(Exception):
    """The cell ran past its timeout and did not stop within the grace after its interrupt."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"the cell ran over {timeout:g}s and did not stop on interrupt")


async def paced(
    receive: Callable[[float], Awaitable[T | None]],
    interrupt: Callable[[], Awaitable[None]],
    timeout: float | None,  # noqa: ASYNC109 - interrupts the cell, not our task
    closed: asyncio.Event,
    *,
    keepalive: float,
    grace: float,
) -> AsyncIterator[T | None]:
    """What ``receive(wait)`` gets (None when ``wait`` passed quietly: a keepalive is due) until ``closed``; at the
    deadline ``interrupt()`` once, and :class:`CellTimedOut` if the cell still runs ``grace`` seconds later."""
    deadline = time.monotonic() + timeout if timeout else None
    interrupted = False
    while not closed.is_set():
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            if interrupted:
                assert timeout is not None
                raise CellTimedOut(timeout)
            interrupted, deadline = True, now + grace
            await interrupt()
        wait = keepalive if deadline is None else max(0.05, min(keepalive, deadline - now))
        yield await receive(wait)


#: Jupyter MIME type → the field of E2B's ``result`` line.
RESULT_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}


def result_line(data: dict[str, Any], *, main: bool) -> dict[str, Any]:
    """E2B's ``result`` line of one display (MIME type → payload)."""
    line: dict[str, Any] = {"type": "result", "is_main_result": main}
    extra: dict[str, Any] = {}
    for mime, payload in data.items():
        name = RESULT_FIELDS.get(mime)
        value = "".join(payload) if isinstance(payload, list) and mime != "application/json" else payload
        if name is None:
            extra[mime] = value
        elif name == "text" and isinstance(value, str) and len(value) > 1 and value[0] == value[-1] in "'\"":
            line[name] = value[1:-1]  # E2B gives a string result without its repr quotes
        else:
            line[name] = value
    if extra:
        line["extra"] = extra
    return line


def error_line(name: str, value: str, traceback: str = "") -> dict[str, Any]:
    return {"type": "error", "name": name, "value": value, "traceback": traceback or f"{name}: {value}"}
