"""A started container exec as a ``ProgramHandle``: streamed output, interactive stdin, kill, wait.

The exec's stream is read by a thread (:meth:`ExecRun.pump`); each frame is captured in
the run's head+tail buffers and handed to the event loop for :meth:`stream`. A slow or
absent stream consumer holds the pumping thread back (bounded chunks in flight), so the
daemon stops reading the program's output instead of us buffering it without limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import threading
from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING

from ...errors import UsageError
from ...models import OutputChunk, PtySize, RunResult
from ...process.preparation import PreparedRun
from ...process.programs import OutputLog, StartedProgram, program_info
from .execrun import KILL_GRACE, ExecRun

if TYPE_CHECKING:
    from .runner import ContainerRunner

__all__ = ["ContainerHandle"]

#: Chunks delivered to the loop but not yet taken by a stream consumer before the pump waits.
_IN_FLIGHT = 64
_POLL = 0.05


class ContainerHandle(StartedProgram):
    """Implements ``ProgramHandle`` for one exec in a workspace container."""

    def __init__(self, runner: ContainerRunner, prep: PreparedRun) -> None:
        self._runner = runner
        self._prep = prep
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[OutputChunk | None] = asyncio.Queue()
        self._room = threading.Semaphore(_IN_FLIGHT)
        # set when nobody will take chunks any more (wait() without stream, kill, end): the pump stops waiting
        self._released = threading.Event()
        self._run: ExecRun | None = None
        self._pump: asyncio.Future[None] | None = None
        self._done: asyncio.Future[RunResult] | None = None
        self._killed = False
        self._streaming = False
        self._stdin_open = True
        self._stdin_task: asyncio.Future[None] | None = None
        self._log = OutputLog()
        self._info = program_info(prep.spec, 0)

    # -- called by the runner ----------------------------------------------------------------

    def on_chunk(self, fd: int, data: bytes) -> None:
        """From the pumping thread: pass a chunk to the loop once there is room for it; once nobody streams, to
        attached readers only, at once. (Each chunk held back a poll's time made a 30 MB run take 43 s, and the
        daemon gives an exited exec's output 2 s to drain before it cuts the rest.)"""
        chunk = OutputChunk("stdout" if fd == 1 else "stderr", data)
        deliver = self._log.append
        while not self._released.is_set():
            if self._room.acquire(timeout=_POLL):
                deliver = self._deliver
                break
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody streams any more
            self._loop.call_soon_threadsafe(deliver, chunk)

    def _deliver(self, chunk: OutputChunk) -> None:
        self._queue.put_nowait(chunk)
        self._log.append(chunk)

    def begin(self, run: ExecRun, pid: int) -> None:
        self._run = run
        self._info = dataclasses.replace(self._info, pid=pid)
        self._pump = asyncio.ensure_future(asyncio.to_thread(run.pump))
        self._done = asyncio.ensure_future(self._supervise(run, self._pump))
        stdin = self._prep.spec.stdin
        if stdin:
            self._stdin_task = asyncio.ensure_future(self.write_stdin(stdin))

    async def _supervise(self, run: ExecRun, pump: asyncio.Future[None]) -> RunResult:
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.shield(pump), self._prep.spec.timeout)
        except TimeoutError:
            timed_out = True
            self._released.set()  # a pump waiting for a consumer must reach the end of the stream
            await self._runner.kill_run(run, self._prep, pump, grace=KILL_GRACE)
        finally:
            self._released.set()
            self._queue.put_nowait(None)
            self._log.close()
            run.close()  # unblocks a stdin writer the program never read from
            if pump.done():
                run.release()
        return await self._runner.finish(run, self._prep, timed_out, killed=self._killed and not timed_out)

    # -- ProgramHandle ---------------------------------------------------------------------

    def attach(self, *, from_start: bool = True) -> AsyncIterator[OutputChunk]:
        return self._log.attach(from_start=from_start)

    async def signal(self, sig: int) -> None:
        if self._run is None or self.finished:
            return
        name = signal.Signals(sig).name.removeprefix("SIG")
        await self._runner.signal_run(self._run, self._prep, name)

    async def resize(self, size: PtySize) -> None:
        raise UsageError("this program has no terminal to resize: the container backend runs programs without a pty")

    async def stream(self) -> AsyncIterator[OutputChunk]:
        """Yield output as it arrives (from the start: nothing is lost before the first call)."""
        self._streaming = True
        while True:
            chunk = await self._queue.get()
            if chunk is None:
                self._queue.put_nowait(None)  # a second stream() ends too
                return
            self._room.release()
            yield chunk

    async def write_stdin(self, data: bytes | str) -> None:
        run = self._run
        if run is None or not self._stdin_open:
            raise UsageError("stdin is closed")
        payload = data.encode() if isinstance(data, str) else data
        with contextlib.suppress(OSError):  # the program ended or closed its stdin
            await asyncio.to_thread(run.send_stdin, payload)

    async def close_stdin(self) -> None:
        if self._run is not None and self._stdin_open:
            self._stdin_open = False
            with contextlib.suppress(OSError):
                await asyncio.to_thread(self._run.end_stdin)

    async def kill(self) -> None:
        """Kill every process of the run: SIGTERM, then SIGKILL after the grace period."""
        assert self._run is not None and self._pump is not None
        if self._pump.done():
            return
        self._killed = True
        self._released.set()
        await self._runner.kill_run(self._run, self._prep, self._pump, grace=KILL_GRACE)

    async def wait(self) -> RunResult:
        assert self._done is not None
        if not self._streaming:
            self._released.set()  # nobody streams: the capture buffers keep the output
        return await asyncio.shield(self._done)

    async def __aenter__(self) -> ContainerHandle:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._done is not None and not self._done.done():
            await asyncio.shield(self._teardown())

    async def _teardown(self) -> None:
        await self.kill()
        assert self._done is not None
        with contextlib.suppress(Exception):
            await self._done
