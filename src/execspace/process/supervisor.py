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
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

from ..errors import UsageError
from ..models import OutputChunk, ProgramInfo, PtySize, RunResult
from .capture import HeadTailBuffer
from .freezing import Freezer, stop_signals
from .pacing import OutputPace
from .proctree import CpuClock, tree_cpu_seconds
from .programs import OutputLog
from .runstack import RunStack

__all__ = [
    "RUN_MARKER_VAR",
    "DirectTransport",
    "Launch",
    "MarkerSweeper",
    "Spawner",
    "SupervisedProcess",
    "Terminal",
    "Transport",
    "kill_marked_processes",
    "spawn",
]

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
    step built. What a step opens for the run it registers on the run's exit stack (:attr:`stack`), which every
    plan made from the first one shares.
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
    stack: RunStack = field(default_factory=RunStack)
    """What the run's steps opened for it, released once it is started and once it is over (:class:`.RunStack`)."""
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
    cpu_clock: CpuClock = tree_cpu_seconds
    """How much CPU the process's tree has used (:mod:`.proctree`): a wrapper's own count (the sandbox's cgroup),
    else the tree's processes summed."""
    output_pace: OutputPace | None = None
    """How fast its output is read (:mod:`.pacing`), shared with the other programs of its workspace; None: as fast
    as it comes."""


class _Protocol(asyncio.SubprocessProtocol):
    def __init__(self, owner: SupervisedProcess) -> None:
        self.owner = owner

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        self.owner.received(fd, data if isinstance(data, bytes) else data.encode())

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self.owner.output_ended(fd)

    def process_exited(self) -> None:
        self.owner.program_exited()


class _PtyReader(asyncio.Protocol):
    """Reads the terminal's master side: everything the program writes to its tty comes here as stdout."""

    def __init__(self, owner: SupervisedProcess) -> None:
        self.owner = owner

    def data_received(self, data: bytes) -> None:
        self.owner.received(1, data)

    def connection_lost(self, exc: Exception | None) -> None:
        # EIO once the last holder of the terminal's other side is gone: the end of the output
        self.owner.output_ended(1)


def _set_size(fd: int, size: PtySize) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size.rows, size.cols, 0, 0))


def _take_terminal() -> None:
    # in the child, after setsid(): the terminal on fd 0 becomes the session's controlling tty (job control,
    # SIGWINCH on resize, ^C as SIGINT)
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


#: Signals a program must not inherit ignored: an ignored signal stays so across exec, and a host started under
#: ``nohup`` or in a background job of a script ignores these, so a program's ``trap ... INT`` (and a kernel's
#: interrupt) would never fire. (asyncio's subprocess restores SIGPIPE and SIGXFSZ already.)
_RESET_SIGNALS = (signal.SIGINT, signal.SIGQUIT)


def _with_default_signals(then: Callable[[], None] | None) -> Callable[[], None] | None:
    """``then`` preceded by the reset of what this process ignores of :data:`_RESET_SIGNALS` (``then`` itself when
    it ignores none: no preexec step for a host that needs none)."""
    ignored = [sig for sig in _RESET_SIGNALS if signal.getsignal(sig) == signal.SIG_IGN]
    if not ignored:
        return then

    def preexec() -> None:
        for sig in ignored:
            signal.signal(sig, signal.SIG_DFL)
        if then is not None:
            then()

    return preexec


def _pty_preexec(then: Callable[[], None] | None) -> Callable[[], None]:
    def preexec() -> None:
        _take_terminal()
        if then is not None:
            then()

    return preexec


class Terminal:
    """The host's side of a program's pseudo-terminal: the program's output comes from it as stdout, its input
    goes to it. ``slave`` is the side the program gets (the opener closes it once the program holds it)."""

    def __init__(self, size: PtySize) -> None:
        master, self.slave = os.openpty()
        os.set_blocking(master, False)
        _set_size(master, size)
        self._master: int | None = master
        self._connected = False
        self.writer: asyncio.WriteTransport | None = None

    async def connect(self, proc: SupervisedProcess) -> asyncio.ReadTransport:
        """Wire the terminal's output to ``proc``; the reader (which owns the master side from now on)."""
        assert self._master is not None
        loop = asyncio.get_running_loop()
        reader, _ = await loop.connect_read_pipe(lambda: _PtyReader(proc), os.fdopen(self._master, "rb", 0))
        self._connected = True
        writer, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(os.dup(self._master), "wb", 0))
        self.writer = writer
        return reader

    def close(self) -> None:
        """Let go of the master side if no reader took it (the start failed)."""
        if self._master is not None and not self._connected:
            with contextlib.suppress(OSError):
                os.close(self._master)
        self._master = None

    def resize(self, size: PtySize) -> None:
        if self.writer is not None and not self.writer.is_closing():
            with contextlib.suppress(OSError):  # the terminal is gone: the program ended
                _set_size(self.writer.get_extra_info("pipe").fileno(), size)


class Transport(Protocol):
    """What a spawner gives a :class:`SupervisedProcess`: how its program is started and reached — its output
    readers, its stdin, its pid and exit, signals and kills, the sweep of its escaped descendants. The process
    does the supervision (deadline, output caps, streams, the kill sequence, the result) the same for all."""

    readers: dict[int, asyncio.ReadTransport]
    """The output readers (fd 1, 2), paused and resumed by the stream's backpressure and the output pace."""
    terminal: Terminal | None
    error: BaseException | None
    """Why the program's end is not its own (its session broke): ``wait`` raises it after the result."""

    @property
    def pid(self) -> int | None: ...
    @property
    def watched(self) -> bool:
        """Its events (exit, end of output) say all that supervision needs: no task supervises it."""
        ...

    async def open(self, proc: SupervisedProcess) -> None:
        """Start the program, its output wired to ``proc`` (``received``, ``output_ended``, ``program_exited``).

        Raises:
            OSError: it could not be started."""
        ...

    def returncode(self) -> int | None: ...
    def stdin(self) -> asyncio.WriteTransport | None: ...
    def signal_group(self, sig: int) -> None:
        """``sig`` to the program's group and what is left of it (SIGKILL of the whole tree)."""
        ...

    def terminate(self) -> bool:
        """SIGTERM to the program if it has started (not to a wrapper still setting up); whether it was sent."""
        ...

    async def signal(self, sig: int) -> None: ...
    async def killed(self) -> None:
        """Wait for the end of a program sent SIGKILL."""
        ...

    def swept_at_once(self) -> bool:
        """For a program over by the end of its start: kill what is left of its group and sweep its escaped
        descendants now, where that needs no wait; whether it did."""
        ...

    async def sweep(self) -> None: ...
    def close(self) -> None:
        """Let go of its pipes, readers and terminal: supervision is over."""
        ...


Spawner = Callable[[Launch], Transport]
"""Chosen once per run: makes the transport that starts a launch (:class:`DirectTransport`, a host process; a
sandbox session's supervisor channel)."""


async def spawn(launch: Launch, spawner: Spawner | None = None) -> SupervisedProcess:
    """Start the process described by ``launch``; raise ``FileNotFoundError``/``PermissionError`` if it cannot.

    ``spawner`` makes its transport (default :class:`DirectTransport`, a host process; e.g. a sandbox session's
    supervisor starts it elsewhere)."""
    proc = SupervisedProcess(launch, (spawner or DirectTransport)(launch))
    try:
        await proc._start()
    except BaseException:
        launch.stack.close()  # the run is over before it began: its releases are due all the same
        raise
    finally:
        launch.stack.spawned()
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


class DirectTransport:
    """A host process started directly: an asyncio subprocess with pipes, or on a pty; in a session and process
    group of its own, so that its group is what signals and kills reach."""

    watched = False
    error: BaseException | None = None

    def __init__(self, launch: Launch) -> None:
        self._launch = launch
        self._sub: asyncio.SubprocessTransport | None = None
        self._proc: SupervisedProcess | None = None
        self.readers: dict[int, asyncio.ReadTransport] = {}
        self.terminal: Terminal | None = None

    @property
    def pid(self) -> int | None:
        return self._sub.get_pid() if self._sub is not None else None

    async def open(self, proc: SupervisedProcess) -> None:
        self._proc = proc
        loop = asyncio.get_running_loop()
        la = self._launch
        kwargs: dict[str, Any] = {}
        if la.user is not None:
            kwargs.update(user=la.user, group=la.group, extra_groups=[])
        if la.pty is not None:
            self.terminal = terminal = Terminal(la.pty)
            slave: int | None = terminal.slave
            kwargs.update(stdin=slave, stdout=slave, stderr=slave)
            preexec = _pty_preexec(la.preexec_fn) if la.pty_controlling else la.preexec_fn
            if (preexec := _with_default_signals(preexec)) is not None:
                kwargs["preexec_fn"] = preexec
            proc.expect_output({1})
        else:
            slave = None
            wants_stdin = la.stdin is not None or la.interactive
            kwargs.update(
                stdin=asyncio.subprocess.PIPE if wants_stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            if (preexec := _with_default_signals(la.preexec_fn)) is not None:
                kwargs["preexec_fn"] = preexec
        creating = asyncio.ensure_future(
            loop.subprocess_exec(
                lambda: _Protocol(proc),
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
            sub, _ = await asyncio.shield(creating)
        except BaseException:
            if self.terminal is not None:
                self.terminal.close()
            if not creating.done():
                creating.add_done_callback(_kill_unsupervised)
            raise
        finally:
            if slave is not None:
                os.close(slave)  # the program holds it now; ours would keep the output from ever ending
        if self.terminal is not None:
            try:
                self.readers[1] = await self.terminal.connect(proc)
            except BaseException:
                _kill_group(sub)
                raise
        else:
            for fd in (1, 2):
                pipe = sub.get_pipe_transport(fd)
                if pipe is not None:
                    self.readers[fd] = pipe  # type: ignore[assignment]
        self._sub = sub

    def returncode(self) -> int | None:
        return self._sub.get_returncode() if self._sub is not None else None

    def stdin(self) -> asyncio.WriteTransport | None:
        if self.terminal is not None:
            return self.terminal.writer
        return self._sub.get_pipe_transport(0) if self._sub is not None else None  # type: ignore[return-value]

    def signal_group(self, sig: int) -> None:
        pid = self.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)

    def _program_group(self) -> int | None:
        pid = self.pid
        target = self._launch.signal_target
        return pid if pid is None or target is None else target(pid)

    def terminate(self) -> bool:
        group = self._program_group()
        if group is None:
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGTERM)
        return True

    async def signal(self, sig: int) -> None:
        pid = self.pid
        if pid is None or self._proc is None:
            return
        # a wrapper still setting up has no program to take the signal yet: wait for it (a few ms), as the signal
        # is the program's, not the wrapper's to die of
        for _ in range(int(_SIGNAL_SETUP_WAIT / _SIGNAL_SETUP_POLL)):  # its start shows in /proc only: poll
            if (group := self._program_group()) is not None or self._proc.exited:
                break
            await asyncio.sleep(_SIGNAL_SETUP_POLL)
        if self._proc.exited:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid if group is None else group, sig)

    async def killed(self) -> None:
        # a host process: the kernel sees to it
        assert self._proc is not None
        await self._proc.wait_exited()

    def swept_at_once(self) -> bool:
        return False  # a host process's sweep is batched

    async def sweep(self) -> None:
        # also for sandboxes: bwrap's PID namespace normally takes every process along, but a kill that
        # lands while bwrap is still setting up its child can beat --die-with-parent (seen under load)
        sweeper = self._launch.sweeper
        if sweeper is not None:
            await sweeper.sweep(self._launch.marker, self.pid)
        else:
            await asyncio.to_thread(kill_marked_processes, self._launch.marker, self.pid)

    def close(self) -> None:
        if self._sub is not None:
            self._sub.close()
        for pipe in (*self.readers.values(), self.terminal.writer if self.terminal is not None else None):
            if pipe is not None:
                pipe.close()


class SupervisedProcess:
    """A running program under supervision; implements the ``ProgramHandle`` protocol.

    What started it and reaches it is its :class:`Transport` (a spawner's); what it does is the same whatever
    the transport: the deadline, the bounded capture, streams and attach, the kill sequence, the result."""

    def __init__(self, launch: Launch, transport: Transport) -> None:
        self._launch = launch
        self._transport = transport
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
        self._done: asyncio.Future[RunResult] | None = None
        self._t0 = 0.0
        self._stdin_task: asyncio.Task[None] | None = None
        self._streaming = False
        self._log = OutputLog() if launch.interactive else None
        self._held_back = False
        """The output pace holds the pipes back for a while (the stream's backpressure must not resume them)."""
        self._stdin_closed = False
        self._waiters: list[asyncio.Future[None]] = []
        self._watched: asyncio.Future[RunResult] | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._winding: asyncio.Task[RunResult] | None = None

    # -- start ---------------------------------------------------------------------

    async def _start(self) -> None:
        la = self._launch
        self._t0 = time.monotonic()
        await self._transport.open(self)
        if la.interactive:
            # queue from the start so that a stream() opened right after spawn misses nothing,
            # including what arrived while the pipes were being connected (kept in the backlog)
            self._open_queue()
        if self._transport.returncode() is not None:  # exited before the protocol was wired
            self._exited.set()
        if la.stdin is not None:
            self._stdin_task = asyncio.create_task(self._feed_stdin(la.stdin, close=not la.interactive))
        elif (watched := self._watch()) is not None:
            self._done = watched
            return
        elif self._exited.is_set() and self._pipes_closed.is_set() and self._transport.swept_at_once():
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
        its own, for a transport whose events say all that supervision needs (``None``: a task supervises it):
        a session run that captures ends in one message of the supervisor, saying its output ended too, and its
        deadline is a timer."""
        if not self._transport.watched:
            return None
        loop = asyncio.get_running_loop()
        self._watched = loop.create_future()
        if self._launch.timeout is not None:
            self._deadline = loop.call_later(self._launch.timeout, self._ran_out)
        self.settle()
        return self._watched

    def settle(self) -> None:
        """After an event of a watched run: if it ended, finish it now (its leftovers swept at once), or in a task
        when its output outlives it (held by a descendant that left its group)."""
        done = self._watched
        if done is None or done.done() or self._winding is not None or not self._exited.is_set():
            return
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        try:
            now = self._pipes_closed.is_set() and self._transport.swept_at_once()
            if now:
                done.set_result(self._finish(timed_out=False))
        except Exception as exc:  # its caller's, not the transport's whose event this is
            now = True
            done.set_exception(exc)
        if now:
            self._wake_waiters()
        else:
            self._wind_up_in_task(self._wind_up(timed_out=False))

    def _ran_out(self) -> None:
        self._deadline = None
        if self._watched is not None and not self._watched.done() and self._winding is None:
            self._wind_up_in_task(self._run_out())

    def _wind_up_in_task(self, supervision: Coroutine[Any, Any, RunResult]) -> None:
        self._winding = task = asyncio.ensure_future(self._then_wake(supervision))
        task.add_done_callback(self._wound_up)

    def _wound_up(self, task: asyncio.Task[RunResult]) -> None:
        done = self._watched
        assert done is not None
        if done.done():
            return
        if task.cancelled():
            done.cancel()
        elif (exc := task.exception()) is not None:
            done.set_exception(exc)
        else:
            done.set_result(task.result())

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

    @property
    def pid(self) -> int | None:
        return self._transport.pid

    @property
    def transport(self) -> Transport:
        """What started the program and reaches it (its spawner's)."""
        return self._transport

    @property
    def exited(self) -> bool:
        """The program exited (or was reported over)."""
        return self._exited.is_set()

    async def wait_exited(self) -> None:
        await self._exited.wait()

    @property
    def freezer(self) -> Freezer:
        """How this process's tree is held still (:attr:`Launch.freezer`)."""
        return self._launch.freezer

    def cpu_seconds(self) -> float:
        """How much CPU this process's tree has used so far (:attr:`Launch.cpu_clock`); 0 before it started."""
        pid = self.pid
        return self._launch.cpu_clock([pid]) if pid is not None else 0.0

    @property
    def finished(self) -> bool:
        """Supervision is over: the program was reaped and the run's exit stack closed."""
        return self._done is not None and self._done.done()

    @property
    def info(self) -> ProgramInfo:
        template = self._launch.info
        if template is None:
            raise UsageError("only programs started with start_program have a ProgramInfo")
        return dataclasses.replace(template, pid=self.pid or 0)

    # -- what the transport reports ------------------------------------------------------

    def expect_output(self, fds: set[int]) -> None:
        """The outputs the program has (a terminal's program has only fd 1); set by the transport's open."""
        self._open_pipes = set(fds)

    def output_open(self, fd: int) -> bool:
        """Whether output ``fd`` has not ended yet."""
        return fd in self._open_pipes

    def received(self, fd: int, data: bytes) -> None:
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

    def output_ended(self, fd: int) -> None:
        self._open_pipes.discard(fd)
        if not self._open_pipes & {1, 2}:
            self._pipes_closed.set()
            if self._log is not None:
                self._log.close()
            if self._queue is not None:
                self._queue.put_nowait(None)

    def program_exited(self) -> None:
        self._exited.set()

    def _pause_pipes(self, pause: bool) -> None:
        for pipe in self._transport.readers.values():
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
        self._transport.signal_group(signal.SIGKILL)
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
        code = self._transport.returncode()
        self._transport.close()
        self._launch.stack.close()
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
        return self._launch.stack.annotated(result)

    async def signal(self, sig: int) -> None:
        await self._transport.signal(sig)

    async def resize(self, size: PtySize) -> None:
        if self._launch.pty is None:
            raise UsageError("this program has no terminal to resize: start it with pty=PtySize(...)")
        if self._transport.terminal is not None:
            self._transport.terminal.resize(size)

    def attach(self, *, from_start: bool = True) -> AsyncIterator[OutputChunk]:
        if self._log is None:
            raise UsageError("only programs started with start_program can be attached to")
        return self._log.attach(from_start=from_start)

    async def _kill_tree(self) -> None:
        # TERM goes to the program itself (inside a wrapper such as bwrap, which would die of it and take the
        # program down with SIGKILL): its handlers get the grace period to clean up. A program not started yet
        # (the wrapper still sets up) has no handler to run: it must never start, so SIGKILL at once
        if self._transport.terminate():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._launch.kill_grace):
                    await self._exited.wait()
        self._transport.signal_group(signal.SIGKILL)
        await self._transport.killed()

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
        if self._stdin_closed:
            return None
        pipe = self._transport.stdin()
        if pipe is None or pipe.is_closing():
            return None
        return pipe

    async def _sweep(self) -> None:
        await self._transport.sweep()

    async def kill(self) -> None:
        await self._kill_tree()
        await self._sweep()

    async def kill_now(self) -> None:
        """SIGKILL the whole tree without a grace period and wait until supervision is over: for the removal of
        its workspace, which a program given time to react could keep changing."""
        self._transport.signal_group(signal.SIGKILL)
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
        result = self._done.result()
        if self._transport.error is not None:
            raise self._transport.error
        return result

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
