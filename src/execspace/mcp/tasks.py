"""Long tool calls: progress while they run, and a Task (the ``io.modelcontextprotocol/tasks`` extension, SEP-2663)
when one outlasts ``task_after`` for a client that declared the extension.

A call runs as its own asyncio task. While the request waits, a client that sent a progress token gets a
``notifications/progress`` every ``progress_interval`` (seconds run so far). Past ``task_after`` the request answers
with a ``CreateTaskResult`` (``resultType: "task"``) and the call keeps running: ``tasks/get`` tells its status (the
seconds run as ``statusMessage``) and, once it is done, its ``CallToolResult``; ``tasks/cancel`` stops it (its run is
killed like any cancelled call's). A finished task is kept for ``task_ttl`` seconds from its creation. A client
that did not declare the extension always waits for the result, as the extension requires.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..errors import TaskNotFound
from .calls import Caller

__all__ = ["Tasks"]

Result = dict[str, Any]
#: JSON-RPC's internal error: a task whose call raised (a tool's own mistakes are results, never this).
_INTERNAL_ERROR = -32603


@dataclass(slots=True)
class _Task:
    id: str
    job: asyncio.Task[Result]
    created: float
    updated: float
    cancelled: bool = False


class Tasks:
    """The server's running and recently finished tasks; runs every tool call (:meth:`run`)."""

    def __init__(
        self,
        *,
        after: float,
        ttl: float,
        progress_interval: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.after = after
        self.ttl = ttl
        self.progress_interval = progress_interval
        self._clock = clock
        self._tasks: dict[str, _Task] = {}

    async def run(self, work: Awaitable[Result], caller: Caller) -> Result:
        """The result of ``work``, or, for a caller that accepts tasks, a ``CreateTaskResult`` once it has run
        ``after`` seconds. Cancelling the request cancels ``work`` unless it became a task."""
        job = asyncio.ensure_future(work)
        started = self._clock()
        deadline = started + self.after if caller.tasks else math.inf
        try:
            while True:
                now = self._clock()
                if now >= deadline:
                    return self._adopt(job, started)
                await asyncio.wait({job}, timeout=min(self.progress_interval, deadline - now))
                if job.done():
                    return job.result()
                if caller.progress is not None:
                    elapsed = self._clock() - started
                    await caller.progress(round(elapsed, 1), _running(elapsed))
        except BaseException:  # the request went away before the call became a task: so does the call
            job.cancel()
            raise

    def get(self, task_id: str) -> Result:
        """``tasks/get``: the task as it is now (its result or error inlined once it is done).

        Raises:
            TaskNotFound: no task of that id.
        """
        task = self._find(task_id)
        out = self._shape(task)
        job = task.job
        if not job.done():
            out["statusMessage"] = _running(self._clock() - task.created)
        elif task.cancelled or job.cancelled():
            out["status"] = "cancelled"
        elif (exc := job.exception()) is not None:
            out |= {"status": "failed", "error": {"code": _INTERNAL_ERROR, "message": f"{type(exc).__name__}: {exc}"}}
        else:
            out |= {"status": "completed", "result": job.result()}
        return out

    def cancel(self, task_id: str) -> None:
        """``tasks/cancel``: stop the task's call (a finished task stays as it ended).

        Raises:
            TaskNotFound: no task of that id.
        """
        task = self._find(task_id)
        if not task.job.done():
            task.cancelled = True
            task.updated = self._clock()
            task.job.cancel()

    async def aclose(self) -> None:
        """Cancel every running task and wait for them to end (their runs stopped)."""
        jobs = [t.job for t in self._tasks.values() if not t.job.done()]
        self._tasks.clear()
        for job in jobs:
            job.cancel()
        for job in jobs:
            with contextlib.suppress(BaseException):
                await job

    def _adopt(self, job: asyncio.Task[Result], started: float) -> Result:
        self._purge()
        task = _Task(f"task-{secrets.token_hex(12)}", job, started, self._clock())
        self._tasks[task.id] = task
        job.add_done_callback(lambda _: self._touch(task))
        return {"resultType": "task", **self._shape(task), "statusMessage": _running(self._clock() - started)}

    def _touch(self, task: _Task) -> None:
        task.updated = self._clock()

    def _find(self, task_id: str) -> _Task:
        self._purge()
        task = self._tasks.get(task_id)
        if task is None:
            raise TaskNotFound(
                f"no task {task_id!r} on this server: it never existed, or it ended more than {self.ttl:g} s after "
                "it began (the time to live its creation gave); call the tool again"
            )
        return task

    def _purge(self) -> None:
        """Forget finished tasks past their time to live (a running one is work in progress: it stays)."""
        now = self._clock()
        for task_id, task in list(self._tasks.items()):
            if task.job.done() and now - task.created > self.ttl:
                del self._tasks[task_id]

    def _shape(self, task: _Task) -> Result:
        return {
            "taskId": task.id,
            "status": "working",
            "createdAt": _iso(task.created),
            "lastUpdatedAt": _iso(task.updated),
            "ttlMs": round(self.ttl * 1000),
            "pollIntervalMs": round(self.progress_interval * 1000),
        }


def _running(elapsed: float) -> str:
    return f"running for {elapsed:.0f} s"


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
