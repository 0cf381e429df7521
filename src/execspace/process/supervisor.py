"""Start a host process, capture its output within bounds, and make sure it dies.

Backends that run host processes (local, sandbox) describe *what* to launch in a
:class:`Launch`; :class:`SupervisedProcess` does the rest:

* the program gets its own session and process group, so the whole group is
  killed on timeout (SIGTERM, then SIGKILL after a grace period) and whatever is
  left of the group when the main process exits is killed too: a run leaves
  nothing behind;
* every process carries a per-run marker in its environment; a descendant that
  escaped the group (``setsid``, double fork) is found by that marker in ``/proc``
  and killed when the run is torn down (Linux; the sandbox backend's PID namespace
  makes this moot there);
* stdout and stderr are read by an asyncio protocol straight into head+tail
  buffers, so memory stays bounded whatever the program prints;
* the output produced before a timeout or kill is kept in the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from ..errors import UsageError
from ..models import OutputChunk, RunResult
from .capture import HeadTailBuffer

__all__ = ["RUN_MARKER_VAR", "Launch", "MarkerSweeper", "SupervisedProcess", "kill_marked_processes", "spawn"]

#: Environment variable carrying the per-run marker used to find escaped descendants.
RUN_MARKER_VAR = "EXECSPACE_RUN"
_STREAM_QUEUE_HIGH = 64  # chunks buffered for a slow stream consumer before the pipe is paused
_STREAM_BACKLOG = 1024 * 1024  # bytes kept for stream() from before it is first called
_DRAIN_AFTER_EXIT = 0.5  # seconds to wait for pipes held by leftovers after the main process exits


@dataclass(slots=True)
class Launch:
    """Everything needed to start one supervised process."""

    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str
    marker: str
    stdin: bytes | None = None
    interactive: bool = False
    """Keep stdin open for ``write_stdin`` (otherwise it is fed ``stdin`` and closed)."""
    timeout: float | None = None
    output_limit: int | None = None
    kill_grace: float = 2.0
    preexec_fn: Callable[[], None] | None = None
    pass_fds: Sequence[int] = ()
    user: int | None = None
    group: int | None = None
    run_dir: str = ""
    classify_exit: Callable[[int], str | None] | None = None
    """Maps an exit code to the name of the limit that caused it (e.g. SIGXCPU → cpu_seconds)."""
    exit_status: Callable[[int, bytes], int] | None = None
    """Maps (exit code, stderr) to the exit code to report: a wrapper that could not start the program reports
    it its own way (bwrap: exit 1), a shell says 127 or 126."""
    on_exit: list[Callable[[], None]] = field(default_factory=list)
    """Run once the run is over: the process exited (or was killed) and was reaped, or it failed to start."""
    after_spawn: list[Callable[[], None]] = field(default_factory=list)
    """Run once the process is started, or failed to start: e.g. close fds that only the child needed."""
    sweeper: MarkerSweeper | None = None
    """Shared batcher for the escaped-descendant sweep (one per runner)."""


class _Protocol(asyncio.SubprocessProtocol):
    def __init__(self, owner: SupervisedProcess) -> None:
        self.owner = owner

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        self.owner._on_data(fd, data if isinstance(data, bytes) else data.encode())

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self.owner._on_pipe_closed(fd)

    def process_exited(self) -> None:
        self.owner._on_exit()


async def spawn(launch: Launch, process: Callable[[Launch], SupervisedProcess] | None = None) -> SupervisedProcess:
    """Start the process described by ``launch``; raise ``FileNotFoundError``/``PermissionError`` if it cannot.

    ``process`` makes the handle (default :class:`SupervisedProcess`, a host process; a subclass may start it
    elsewhere, e.g. through a sandbox session's supervisor)."""
    proc = (process or SupervisedProcess)(launch)
    try:
        await proc._start()
    except BaseException:
        for hook in launch.on_exit:  # the run is over before it began: its cleanups are due all the same
            hook()
        raise
    finally:
        for hook in launch.after_spawn:
            hook()
    return proc


class SupervisedProcess:
    """A running program under supervision; implements the ``ProgramHandle`` protocol."""

    def __init__(self, launch: Launch) -> None:
        self._launch = launch
        self._out = HeadTailBuffer(launch.output_limit)
        self._err = HeadTailBuffer(launch.output_limit)
        self._open_pipes = {1, 2}
        self._pipes_closed = asyncio.Event()
        self._exited = asyncio.Event()
        self._queue: asyncio.Queue[OutputChunk | None] | None = None
        # output that arrives before stream() is called (even during spawn) is kept for it, bounded;
        # interactive handles only: run_program never streams
        self._backlog: list[OutputChunk] | None = [] if launch.interactive else None
        self._backlog_room = _STREAM_BACKLOG
        self._transport: asyncio.SubprocessTransport | None = None
        self._done: asyncio.Future[RunResult] | None = None
        self._kill_reason: Literal["timeout", "killed"] | None = None
        self._t0 = 0.0
        self._stdin_task: asyncio.Task[None] | None = None
        self._streaming = False

    # -- start ---------------------------------------------------------------------

    async def _start(self) -> None:
        la = self._launch
        self._t0 = time.monotonic()
        transport = await self._open_transport()
        self._transport = transport
        if la.interactive:
            # queue from the start so that a stream() opened right after spawn misses nothing,
            # including what arrived while the pipes were being connected (kept in the backlog)
            self._queue = asyncio.Queue()
            for early in self._backlog or ():
                self._queue.put_nowait(early)
            self._backlog = None
        if transport.get_returncode() is not None:  # exited before the protocol was wired
            self._exited.set()
        if la.stdin is not None:
            self._stdin_task = asyncio.create_task(self._feed_stdin(la.stdin, close=not la.interactive))
        self._done = asyncio.ensure_future(self._supervise())

    async def _open_transport(self) -> asyncio.SubprocessTransport:
        """Start the process; its output goes to :meth:`_on_data`, its pipes' and its own end are reported."""
        loop = asyncio.get_running_loop()
        la = self._launch
        kwargs: dict[str, Any] = {}
        if la.user is not None:
            kwargs.update(user=la.user, group=la.group, extra_groups=[])
        if la.preexec_fn is not None:
            kwargs["preexec_fn"] = la.preexec_fn
        transport, _ = await loop.subprocess_exec(
            lambda: _Protocol(self),
            *la.argv,
            stdin=asyncio.subprocess.PIPE if (la.stdin is not None or la.interactive) else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(la.env),
            cwd=la.cwd,
            start_new_session=True,
            close_fds=True,
            pass_fds=tuple(la.pass_fds),
            **kwargs,
        )
        return transport

    @property
    def pid(self) -> int | None:
        return self._transport.get_pid() if self._transport else None

    # -- protocol callbacks ----------------------------------------------------------

    def _on_data(self, fd: int, data: bytes) -> None:
        (self._out if fd == 1 else self._err).write(data)
        chunk = OutputChunk("stdout" if fd == 1 else "stderr", data)
        if self._queue is None:
            if self._backlog is not None and len(data) <= self._backlog_room:
                self._backlog.append(chunk)
                self._backlog_room -= len(data)
            else:
                self._backlog_room = -1  # full: stop here so the backlog stays a prefix of the output
            return
        self._queue.put_nowait(chunk)
        if self._queue.qsize() >= _STREAM_QUEUE_HIGH:
            self._pause_pipes(True)

    def _on_pipe_closed(self, fd: int) -> None:
        self._open_pipes.discard(fd)
        if not self._open_pipes & {1, 2}:
            self._pipes_closed.set()
            if self._queue is not None:
                self._queue.put_nowait(None)

    def _on_exit(self) -> None:
        self._exited.set()

    def _pause_pipes(self, pause: bool) -> None:
        if self._transport is None:
            return
        for fd in (1, 2):
            pipe = self._transport.get_pipe_transport(fd)
            if pipe is not None and not pipe.is_closing():
                if pause:
                    pipe.pause_reading()  # type: ignore[attr-defined]
                else:
                    pipe.resume_reading()  # type: ignore[attr-defined]

    # -- supervision -----------------------------------------------------------------

    async def _supervise(self) -> RunResult:
        la = self._launch
        timed_out = False
        try:
            async with asyncio.timeout(la.timeout):
                await self._exited.wait()
        except TimeoutError:
            timed_out = True
            self._kill_reason = "timeout"
            await self._kill_tree()
        # leftovers of the group (background children) do not outlive the run
        self._signal_group(signal.SIGKILL)
        try:
            async with asyncio.timeout(_DRAIN_AFTER_EXIT):
                await self._pipes_closed.wait()
        except TimeoutError:
            # something that left the group still holds our pipes: find it by marker
            await self._sweep()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_DRAIN_AFTER_EXIT):
                    await self._pipes_closed.wait()
        # a descendant that left the group and let go of our pipes is only found by its marker
        await self._sweep()
        if self._stdin_task is not None:
            self._stdin_task.cancel()
        assert self._transport is not None
        code = self._transport.get_returncode()
        self._transport.close()
        for hook in la.on_exit:
            hook()
        return self._result(-signal.SIGKILL if code is None else code, timed_out)

    def _result(self, code: int, timed_out: bool) -> RunResult:
        out, err = self._out.getvalue(), self._err.getvalue()
        limit = "timeout" if timed_out else None
        if self._launch.exit_status is not None:
            code = self._launch.exit_status(code, err)
        if limit is None and self._launch.classify_exit is not None:
            limit = self._launch.classify_exit(code)
        return RunResult(
            exit_code=code,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
            duration=time.monotonic() - self._t0,
            timed_out=timed_out,
            stdout_truncated=self._out.truncated,
            stderr_truncated=self._err.truncated,
            stdout_total_bytes=self._out.total,
            stderr_total_bytes=self._err.total,
            limit_hit=limit,
            raw_stdout=out,
            raw_stderr=err,
            run_dir=self._launch.run_dir,
        )

    def _signal_group(self, sig: int) -> None:
        pid = self.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)

    async def _kill_tree(self) -> None:
        self._signal_group(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._launch.kill_grace):
                await self._exited.wait()
        self._signal_group(signal.SIGKILL)
        await self._exited.wait()

    # -- ProgramHandle -------------------------------------------------------------------

    async def stream(self) -> AsyncIterator[OutputChunk]:
        """Yield output as it arrives, starting with what came before the first call
        (up to 1 MiB of it; beyond that, early chunks are only in the final result)."""
        self._streaming = True  # wait() must not drop the queue under a consumer
        if self._queue is None:
            self._queue = asyncio.Queue()
            for early in self._backlog or ():
                self._queue.put_nowait(early)
            self._backlog = None
            if self._pipes_closed.is_set():
                self._queue.put_nowait(None)
        while True:
            chunk = await self._queue.get()
            if chunk is None:
                return
            if self._queue.qsize() < _STREAM_QUEUE_HIGH // 2:
                self._pause_pipes(False)
            yield chunk

    async def _feed_stdin(self, data: bytes, close: bool) -> None:
        await self.write_stdin(data)
        if close:
            await self.close_stdin()

    async def write_stdin(self, data: bytes | str) -> None:
        pipe = self._stdin_pipe()
        if pipe is None:
            raise UsageError("stdin is not open: start the program with interactive=True or stdin data")
        pipe.write(data.encode() if isinstance(data, str) else data)
        # respect flow control so that huge stdin does not pile up in memory
        with contextlib.suppress(ConnectionError, BrokenPipeError):
            while pipe.get_write_buffer_size() > 256 * 1024:
                await asyncio.sleep(0.005)
                if pipe.is_closing():
                    return

    async def close_stdin(self) -> None:
        pipe = self._stdin_pipe()
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()

    def _stdin_pipe(self) -> asyncio.WriteTransport | None:
        if self._transport is None:
            return None
        pipe = self._transport.get_pipe_transport(0)
        if pipe is None or pipe.is_closing():
            return None
        return pipe  # type: ignore[return-value]

    async def _sweep(self) -> None:
        # also for sandboxes: bwrap's PID namespace normally takes every process along, but a kill that
        # lands while bwrap is still setting up its child can beat --die-with-parent (seen under load)
        sweeper = self._launch.sweeper
        if sweeper is not None:
            await sweeper.sweep(self._launch.marker, self.pid)
        else:
            await asyncio.to_thread(kill_marked_processes, self._launch.marker, self.pid)

    async def kill(self) -> None:
        if self._kill_reason is None:
            self._kill_reason = "killed"
        await self._kill_tree()
        await self._sweep()

    async def kill_now(self) -> None:
        """SIGKILL the whole tree without a grace period and wait until supervision is over: for the removal of
        its workspace, which a program given time to react could keep changing."""
        if self._kill_reason is None:
            self._kill_reason = "killed"
        self._signal_group(signal.SIGKILL)
        await self._sweep()
        assert self._done is not None
        with contextlib.suppress(Exception):
            await asyncio.shield(self._done)

    async def wait(self) -> RunResult:
        assert self._done is not None
        if self._queue is not None and not self._streaming:
            # nobody streams: the capture buffers keep the output, unblock the program
            self._queue = None
            self._pause_pipes(False)
        return await asyncio.shield(self._done)

    async def __aenter__(self) -> SupervisedProcess:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._done is not None
        if not self._done.done():
            # leaving early (error, cancellation): kill and reap even if we are being cancelled
            await asyncio.shield(self._teardown())

    async def _teardown(self) -> None:
        if not self._exited.is_set():
            await self.kill()
        assert self._done is not None
        with contextlib.suppress(Exception):
            await self._done


def kill_marked_processes(marker: str, after_pid: int | None = None) -> int:
    """SIGKILL every process whose environment carries ``marker``; return how many (Linux only).

    ``after_pid`` (the run's own pid) lets the scan skip every process that is older.
    """
    return kill_marked_processes_many({marker: after_pid}).get(marker, 0)


def _scan_floor(pids: Mapping[str, int | None]) -> int:
    """Pids at or below the floor cannot be descendants of these runs: they are older.

    Valid while the pid counter has not wrapped since the oldest run started;
    ``ns_last_pid`` below the floor means it has, and then everything is scanned.
    """
    known = [p for p in pids.values() if p is not None]
    if len(known) < len(pids):
        return 0
    floor = min(known)
    try:
        with open("/proc/sys/kernel/ns_last_pid", "rb") as f:
            last = int(f.read())
    except (OSError, ValueError):
        return 0
    return floor if last >= floor else 0


def kill_marked_processes_many(markers: Mapping[str, int | None]) -> dict[str, int]:
    """One /proc scan for several runs at once (marker → the run's pid); return kills per marker."""
    prefix = f"{RUN_MARKER_VAR}=".encode()
    wanted = {m.encode() for m in markers}
    floor = _scan_floor(markers)
    me = os.getpid()
    killed: dict[str, int] = {}
    for _ in range(3):  # a dying parent may fork once more; sweep until quiet
        found = 0
        try:
            names = os.listdir("/proc")
        except OSError:
            return killed
        for name in names:
            if not name.isdigit() or int(name) <= floor or int(name) == me:
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    env = f.read()
            except OSError:
                continue
            at = env.find(prefix)
            if at < 0:
                continue
            value = env[at + len(prefix) : env.find(b"\0", at)]
            if value in wanted:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(name), signal.SIGKILL)
                    found += 1
                    killed[value.decode()] = killed.get(value.decode(), 0) + 1
        if not found:
            break
    return killed


class MarkerSweeper:
    """Batches marker sweeps: runs that end together share one /proc scan.

    Without batching, N concurrent runs each scan all N processes at teardown,
    which halves the throughput of many short runs.
    """

    def __init__(self) -> None:
        self._pending: dict[str, tuple[int | None, asyncio.Future[int]]] = {}
        self._task: asyncio.Task[None] | None = None

    async def sweep(self, marker: str, after_pid: int | None = None) -> int:
        loop = asyncio.get_running_loop()
        entry = self._pending.get(marker)
        fut = entry[1] if entry else loop.create_future()
        self._pending[marker] = (after_pid, fut)
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._drain())
        return await asyncio.shield(fut)

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(0)  # let runs that end in the same loop turn join this scan
            batch, self._pending = self._pending, {}
            try:
                # older processes are skipped, so a scan reads few files: cheaper inline than in a thread
                counts = kill_marked_processes_many({m: pid for m, (pid, _) in batch.items()})
            except BaseException as exc:
                for _, fut in batch.values():
                    if not fut.done():
                        fut.set_exception(exc)
                raise
            for marker, (_, fut) in batch.items():
                if not fut.done():
                    fut.set_result(counts.get(marker, 0))
