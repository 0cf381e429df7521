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
import dataclasses
import fcntl
import os
import signal
import struct
import termios
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from ..errors import UsageError
from ..models import OutputChunk, ProgramInfo, PtySize, RunResult
from .capture import HeadTailBuffer
from .freezing import Freezer, stop_signals
from .pacing import OutputPace
from .programs import OutputLog

__all__ = ["RUN_MARKER_VAR", "Launch", "MarkerSweeper", "SupervisedProcess", "kill_marked_processes", "spawn"]

#: Environment variable carrying the per-run marker used to find escaped descendants.
RUN_MARKER_VAR = "EXECSPACE_RUN"
_STREAM_QUEUE_HIGH = 64  # chunks buffered for a slow stream consumer before the pipe is paused
_STREAM_BACKLOG = 1024 * 1024  # bytes kept for stream() from before it is first called
_DRAIN_AFTER_EXIT = 0.5  # seconds to wait for pipes held by leftovers after the main process exits
_SIGNAL_SETUP_WAIT = 2.0  # seconds signal() waits for a wrapper to start the program
_SIGNAL_SETUP_POLL = 0.002


@dataclass(frozen=True, slots=True)
class Launch:
    """Everything needed to start one supervised process: the run's launch plan, immutable.

    The preparation's runner makes it (:meth:`~.hostrunner.HostRunner.launch`); a wrapper (bubblewrap, the uid
    drop, a session's supervisor) makes a new one from it (``dataclasses.replace``), never changes a plan another
    step built. What a wrapper opened for the run it registers on the run's hooks (``after_spawn``, ``on_exit``,
    ``annotate``), which the run owns: they run once its process started, once it is over (exited, killed, or
    failed to start), and on its result.
    """

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
    exit_status: Callable[[int, bytes], tuple[int, bytes]] | None = None
    """Maps (exit code, stderr) to the exit code and stderr to report: a wrapper that could not start the program
    reports it its own way (bwrap: exit 1 and its own message), a shell says 127 or 126."""
    on_exit: list[Callable[[], None]] = field(default_factory=list)
    """Run once the run is over: the process exited (or was killed) and was reaped, or it failed to start."""
    after_spawn: list[Callable[[], None]] = field(default_factory=list)
    """Run once the process is started, or failed to start: e.g. close fds that only the child needed."""
    annotate: list[Callable[[RunResult], RunResult]] = field(default_factory=list)
    """Add what the wrapper knows to the run's result (after ``on_exit``): e.g. the egress proxy's audit."""
    sweeper: MarkerSweeper | None = None
    """Shared batcher for the escaped-descendant sweep (one per runner)."""
    info: ProgramInfo | None = None
    """What ``list_programs`` reports (its pid is filled in once started); started programs only."""
    pty: PtySize | None = None
    """Run on a new pseudo-terminal of this size: it is the program's stdin, stdout and stderr."""
    pty_controlling: bool = True
    """The started process takes the terminal as its controlling tty. False when a wrapper starts the program in
    a session of its own (bwrap's ``--new-session``) and something inside takes it there (``setsid --ctty``)."""
    signal_target: Callable[[int], int | None] | None = None
    """Maps the started process's pid to the process group ``signal()`` reaches (a wrapper such as bwrap puts the
    program in a session of its own); None while the wrapper has not started the program yet."""
    freezer: Freezer = stop_signals
    """How the process's tree is held still for a snapshot or a pause (:mod:`.freezing`): a wrapper's own (the
    sandbox's cgroup freezer), else signals."""
    output_pace: OutputPace | None = None
    """How fast its output is read (:mod:`.pacing`), shared with the other programs of its workspace; None: as fast
    as it comes."""


class _Protocol(asyncio.SubprocessProtocol):
    def __init__(self, owner: SupervisedProcess) -> None:
        self.owner = owner

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        self.owner._on_data(fd, data if isinstance(data, bytes) else data.encode())

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self.owner._on_pipe_closed(fd)

    def process_exited(self) -> None:
        self.owner._on_exit()


class _PtyReader(asyncio.Protocol):
    """Reads the terminal's master side: everything the program writes to its tty comes here as stdout."""

    def __init__(self, owner: SupervisedProcess) -> None:
        self.owner = owner

    def data_received(self, data: bytes) -> None:
        self.owner._on_data(1, data)

    def connection_lost(self, exc: Exception | None) -> None:
        # EIO once the last holder of the terminal's other side is gone: the end of the output
        self.owner._on_pipe_closed(1)


def _set_size(fd: int, size: PtySize) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size.rows, size.cols, 0, 0))


def _take_terminal() -> None:
    # in the child, after setsid(): the terminal on fd 0 becomes the session's controlling tty (job control,
    # SIGWINCH on resize, ^C as SIGINT)
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _pty_preexec(then: Callable[[], None] | None) -> Callable[[], None]:
    def preexec() -> None:
        _take_terminal()
        if then is not None:
            then()

    return preexec


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


def _kill_group(transport: asyncio.SubprocessTransport) -> None:
    """SIGKILL a started program's whole group and let go of it: its start failed or was cancelled after the
    program began, so nobody will supervise it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(transport.get_pid(), signal.SIGKILL)
    transport.close()


def _kill_unsupervised(creating: asyncio.Future[tuple[asyncio.SubprocessTransport, Any]]) -> None:
    if not creating.cancelled() and creating.exception() is None:
        _kill_group(creating.result()[0])


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
        self._t0 = 0.0
        self._stdin_task: asyncio.Task[None] | None = None
        self._streaming = False
        self._log = OutputLog() if launch.interactive else None
        self._readers: dict[int, asyncio.ReadTransport] = {}
        self._held_back = False
        """The output pace holds the pipes back for a while (the stream's backpressure must not resume them)."""
        self._pty_writer: asyncio.WriteTransport | None = None
        self._pty_master: int | None = None
        self._stdin_closed = False
        self._waiters: list[asyncio.Future[None]] = []

    # -- start ---------------------------------------------------------------------

    async def _start(self) -> None:
        la = self._launch
        self._t0 = time.monotonic()
        transport = await self._open_transport()
        self._transport = transport
        if la.interactive:
            # queue from the start so that a stream() opened right after spawn misses nothing,
            # including what arrived while the pipes were being connected (kept in the backlog)
            self._open_queue()
        if transport.get_returncode() is not None:  # exited before the protocol was wired
            self._exited.set()
        if la.stdin is not None:
            self._stdin_task = asyncio.create_task(self._feed_stdin(la.stdin, close=not la.interactive))
        elif (watched := self._watch()) is not None:
            self._done = watched
            return
        elif self._exited.is_set() and self._pipes_closed.is_set() and self._swept_at_once():
            # over before its start returned (a short session run with stdio of its own, whose exit and end of
            # output came with its start), its leftovers swept: nothing to wait for, so no task and no loop turn
            self._done = asyncio.get_running_loop().create_future()
            try:
                self._done.set_result(self._finish(timed_out=False))
            except Exception as exc:
                self._done.set_exception(exc)
            return
        self._done = asyncio.ensure_future(self._then_wake(self._supervise()))

    def _watch(self) -> asyncio.Future[RunResult] | None:
        """The result as a future that the program's own events complete, with no task and no loop turn of
        its own, for a handle whose events say all that supervision needs (``None``: a task supervises it)."""
        return None

    def _open_queue(self) -> asyncio.Queue[OutputChunk | None]:
        """The stream's queue, holding the backlog, and its end if the output ended already: it can end before
        the queue exists, while the start is still awaited (a session's program whose sockets close in the loop
        turn that brings the supervisor's answer)."""
        queue: asyncio.Queue[OutputChunk | None] = asyncio.Queue()
        for early in self._backlog or ():
            queue.put_nowait(early)
        self._backlog = None
        if self._pipes_closed.is_set():
            queue.put_nowait(None)
        self._queue = queue
        return queue

    async def _open_transport(self) -> asyncio.SubprocessTransport:
        """Start the process with its output wired to :meth:`_on_data` (``_readers``, or the pty's); return its
        transport (pid, exit code, stdin pipe)."""
        loop = asyncio.get_running_loop()
        la = self._launch
        kwargs: dict[str, Any] = {}
        if la.user is not None:
            kwargs.update(user=la.user, group=la.group, extra_groups=[])
        if la.pty is not None:
            slave = self._open_pty(la.pty)
            kwargs.update(stdin=slave, stdout=slave, stderr=slave)
            preexec = _pty_preexec(la.preexec_fn) if la.pty_controlling else la.preexec_fn
            if preexec is not None:
                kwargs["preexec_fn"] = preexec
            self._open_pipes = {1}
        else:
            slave = None
            wants_stdin = la.stdin is not None or la.interactive
            kwargs.update(
                stdin=asyncio.subprocess.PIPE if wants_stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            if la.preexec_fn is not None:
                kwargs["preexec_fn"] = la.preexec_fn
        creating = asyncio.ensure_future(
            loop.subprocess_exec(
                lambda: _Protocol(self),
                *la.argv,
                env=dict(la.env),
                cwd=la.cwd,
                start_new_session=True,
                close_fds=True,
                pass_fds=tuple(la.pass_fds),
                **kwargs,
            )
        )
        try:
            # shielded: asyncio's own clean-up of a start cancelled while it wires the pipes kills the leader
            # alone, then waits for pipes that a child of it (`sleep 300 &`) holds for as long as it lives
            transport, _ = await asyncio.shield(creating)
        except BaseException:
            self._close_pty()
            if not creating.done():
                creating.add_done_callback(_kill_unsupervised)
            raise
        finally:
            if slave is not None:
                os.close(slave)  # the program holds it now; ours would keep the output from ever ending
        if la.pty is not None:
            try:
                await self._connect_pty(loop)
            except BaseException:
                _kill_group(transport)
                raise
        else:
            for fd in (1, 2):
                pipe = transport.get_pipe_transport(fd)
                if pipe is not None:
                    self._readers[fd] = pipe  # type: ignore[assignment]
        return transport

    def _open_pty(self, size: PtySize) -> int:
        master, slave = os.openpty()
        os.set_blocking(master, False)
        self._pty_master = master
        _set_size(master, size)
        return slave

    async def _connect_pty(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._pty_master is not None
        reader, _ = await loop.connect_read_pipe(lambda: _PtyReader(self), os.fdopen(self._pty_master, "rb", 0))
        self._readers[1] = reader
        writer, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(os.dup(self._pty_master), "wb", 0))
        self._pty_writer = writer

    def _close_pty(self) -> None:
        if self._pty_master is not None and not self._readers:
            with contextlib.suppress(OSError):
                os.close(self._pty_master)
        self._pty_master = None

    @property
    def pid(self) -> int | None:
        return self._transport.get_pid() if self._transport else None

    @property
    def freezer(self) -> Freezer:
        """How this process's tree is held still (:attr:`Launch.freezer`)."""
        return self._launch.freezer

    @property
    def finished(self) -> bool:
        """Supervision is over: the program was reaped and the run's ``on_exit`` hooks have run."""
        return self._done is not None and self._done.done()

    @property
    def info(self) -> ProgramInfo:
        template = self._launch.info
        if template is None:
            raise UsageError("only programs started with start_program have a ProgramInfo")
        return dataclasses.replace(template, pid=self.pid or 0)

    # -- protocol callbacks ----------------------------------------------------------

    def _on_data(self, fd: int, data: bytes) -> None:
        self._paced(len(data))
        (self._out if fd == 1 else self._err).write(data)
        chunk = OutputChunk("stdout" if fd == 1 else "stderr", data)
        if self._log is not None:
            self._log.append(chunk)
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

    def _paced(self, nbytes: int) -> None:
        """Hold the pipes back as long as the output pace says after ``nbytes`` read."""
        pace = self._launch.output_pace
        delay = pace.delay(nbytes) if pace is not None else 0.0
        if delay > 0 and not self._held_back:
            self._held_back = True
            self._pause_pipes(True)
            asyncio.get_running_loop().call_later(delay, self._pace_over)

    def _pace_over(self) -> None:
        self._held_back = False
        if self._queue is None or self._queue.qsize() < _STREAM_QUEUE_HIGH:
            self._pause_pipes(False)

    def _on_pipe_closed(self, fd: int) -> None:
        self._open_pipes.discard(fd)
        if not self._open_pipes & {1, 2}:
            self._pipes_closed.set()
            if self._log is not None:
                self._log.close()
            if self._queue is not None:
                self._queue.put_nowait(None)

    def _on_exit(self) -> None:
        self._exited.set()

    def _pause_pipes(self, pause: bool) -> None:
        for pipe in self._readers.values():
            if not pipe.is_closing():
                if pause:
                    pipe.pause_reading()
                else:
                    pipe.resume_reading()

    # -- supervision -----------------------------------------------------------------

    async def _then_wake(self, supervision: Awaitable[RunResult]) -> RunResult:
        try:
            return await supervision
        finally:
            # woken from here, not by a done-callback of the task: a run that exits at once is a loop turn sooner
            self._wake_waiters()

    def _wake_waiters(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _supervise(self) -> RunResult:
        try:
            async with asyncio.timeout(self._launch.timeout):
                await self._exited.wait()
        except TimeoutError:
            return await self._run_out()
        return await self._wind_up(timed_out=False)

    async def _run_out(self) -> RunResult:
        """Its deadline passed: its tree is killed (TERM, the grace period, KILL), and the run ends timed out."""
        await self._kill_tree()
        return await self._wind_up(timed_out=True)

    async def _wind_up(self, timed_out: bool) -> RunResult:
        """After the program's end: its leftovers killed, its output drained, the result."""
        # leftovers of the group (background children) do not outlive the run
        self._signal_group(signal.SIGKILL)
        try:
            if not self._pipes_closed.is_set():  # most runs: their output ended with them, no timer needed
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
        return self._finish(timed_out)

    def _finish(self, timed_out: bool) -> RunResult:
        """The end of supervision, once the program and its leftovers are gone: close, run the hooks, the result."""
        if self._stdin_task is not None:
            self._stdin_task.cancel()
        assert self._transport is not None
        code = self._transport.get_returncode()
        self._transport.close()
        for pipe in (*self._readers.values(), self._pty_writer):
            if pipe is not None:
                pipe.close()
        for hook in self._launch.on_exit:
            hook()
        return self._result(-signal.SIGKILL if code is None else code, timed_out)

    def _result(self, code: int, timed_out: bool) -> RunResult:
        out, err = self._out.getvalue(), self._err.getvalue()
        limit = "timeout" if timed_out else None
        if self._launch.exit_status is not None:
            code, err = self._launch.exit_status(code, err)
        if limit is None and self._launch.classify_exit is not None:
            limit = self._launch.classify_exit(code)
        result = RunResult(
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
        for hook in self._launch.annotate:
            result = hook(result)
        return result

    def _swept_at_once(self) -> bool:
        """For a program over by the end of its start: kill what is left of its group and sweep its escaped
        descendants now, where that needs no wait (never for a host process: its sweep is batched); whether it
        did."""
        return False

    def _signal_group(self, sig: int) -> None:
        pid = self.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)

    def _program_group(self) -> int | None:
        pid = self.pid
        target = self._launch.signal_target
        return pid if pid is None or target is None else target(pid)

    async def signal(self, sig: int) -> None:
        pid = self.pid
        if pid is None:
            return
        # a wrapper still setting up has no program to take the signal yet: wait for it (a few ms), as the signal
        # is the program's, not the wrapper's to die of
        for _ in range(int(_SIGNAL_SETUP_WAIT / _SIGNAL_SETUP_POLL)):  # its start shows in /proc only: poll
            if (group := self._program_group()) is not None or self._exited.is_set():
                break
            await asyncio.sleep(_SIGNAL_SETUP_POLL)
        if self._exited.is_set():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid if group is None else group, sig)

    async def resize(self, size: PtySize) -> None:
        if self._launch.pty is None:
            raise UsageError("this program has no terminal to resize: start it with pty=PtySize(...)")
        if self._pty_writer is not None and not self._pty_writer.is_closing():
            with contextlib.suppress(OSError):  # the terminal is gone: the program ended
                _set_size(self._pty_writer.get_extra_info("pipe").fileno(), size)

    def attach(self, *, from_start: bool = True) -> AsyncIterator[OutputChunk]:
        if self._log is None:
            raise UsageError("only programs started with start_program can be attached to")
        return self._log.attach(from_start=from_start)

    def _terminate(self) -> bool:
        """Send SIGTERM to the program if it has started (not to a wrapper still setting up); whether it was sent."""
        group = self._program_group()
        if group is None:
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGTERM)
        return True

    async def _kill_tree(self) -> None:
        # TERM goes to the program itself (inside a wrapper such as bwrap, which would die of it and take the
        # program down with SIGKILL): its handlers get the grace period to clean up. A program not started yet
        # (the wrapper still sets up) has no handler to run: it must never start, so SIGKILL at once
        if self._terminate():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._launch.kill_grace):
                    await self._exited.wait()
        self._signal_group(signal.SIGKILL)
        await self._killed()

    async def _killed(self) -> None:
        """Wait for the end of a program sent SIGKILL (a host process: the kernel sees to it)."""
        await self._exited.wait()

    # -- ProgramHandle -------------------------------------------------------------------

    async def stream(self) -> AsyncIterator[OutputChunk]:
        """Yield output as it arrives, starting with what came before the first call
        (up to 1 MiB of it; beyond that, early chunks are only in the final result)."""
        self._streaming = True  # wait() must not drop the queue under a consumer
        queue = self._queue if self._queue is not None else self._open_queue()
        while True:
            chunk = await queue.get()
            if chunk is None:
                return
            if queue.qsize() < _STREAM_QUEUE_HIGH // 2 and not self._held_back:
                self._pause_pipes(False)
            yield chunk

    async def _feed_stdin(self, data: bytes, close: bool) -> None:
        await self.write_stdin(data)
        if close:
            await self.close_stdin()

    async def write_stdin(self, data: bytes | str) -> None:
        pipe = self._stdin_pipe()
        if pipe is None:
            raise UsageError("stdin is closed: it was closed, or the program was started without stdin")
        pipe.write(data.encode() if isinstance(data, str) else data)
        # respect flow control so that huge stdin does not pile up in memory
        with contextlib.suppress(ConnectionError, BrokenPipeError):
            while pipe.get_write_buffer_size() > 256 * 1024:
                await asyncio.sleep(0.005)
                if pipe.is_closing():
                    return

    async def close_stdin(self) -> None:
        pipe = self._stdin_pipe()
        if pipe is None:
            return
        self._stdin_closed = True
        with contextlib.suppress(OSError):
            if self._launch.pty is not None:
                pipe.write(b"\x04")  # the terminal stays: EOF is its end-of-file character (VEOF)
            else:
                pipe.close()

    def _stdin_pipe(self) -> asyncio.WriteTransport | None:
        if self._transport is None or self._stdin_closed:
            return None
        pipe = self._pty_writer if self._launch.pty is not None else self._transport.get_pipe_transport(0)
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
        await self._kill_tree()
        await self._sweep()

    async def kill_now(self) -> None:
        """SIGKILL the whole tree without a grace period and wait until supervision is over: for the removal of
        its workspace, which a program given time to react could keep changing."""
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
            if not self._held_back:
                self._pause_pipes(False)
        if not self._done.done():
            # a waiter of its own: the caller's cancellation never reaches the supervision
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                self._waiters.remove(waiter)
            if not self._done.done():  # its last step is the one that woke us
                await asyncio.shield(self._done)
        return self._done.result()

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
