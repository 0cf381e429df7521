"""A program a session's supervisor started, supervised as a host process is (:class:`SessionProgram`), and the
transports that stand for its stdio on the host."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from ...errors import BackendError
from ...models import RunResult
from ...process.supervisor import Launch, SupervisedProcess
from .session import RunDirFailed, Session, close_all
from .sessiontree import kill_marked_children, last_pid

__all__ = ["SessionProgram"]

_READ_SIZE = 256 * 1024


class _SocketReader(asyncio.ReadTransport):
    """The host's reading end of one of a program's output sockets, on the event loop as it is (no transport
    set-up round trip per run): data to the program's :meth:`_on_data`, end of file to ``_on_pipe_closed``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, owner: SessionProgram, fd: int) -> None:
        super().__init__()
        self._loop = loop
        self._sock = sock
        self._owner = owner
        self._fd = fd
        self._paused = False
        self._closing = False
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            data = self._sock.recv(_READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self._owner._on_data(self._fd, data)
        else:
            self.close()

    def is_reading(self) -> bool:
        return not (self._paused or self._closing)

    def pause_reading(self) -> None:
        if self.is_reading():
            self._loop.remove_reader(self._sock.fileno())
            self._paused = True

    def resume_reading(self) -> None:
        if self._paused and not self._closing:
            self._paused = False
            self._loop.add_reader(self._sock.fileno(), self._readable)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        if not self._paused:
            self._loop.remove_reader(self._sock.fileno())
        self._closing = True
        self._sock.close()
        self._owner._on_pipe_closed(self._fd)


class _SessionTransport(asyncio.SubprocessTransport):
    """What :class:`~execspace.process.supervisor.SupervisedProcess` needs of its transport, for a program
    of a session: its pid in the session, its exit code, its stdin."""

    def __init__(self, program: SessionProgram, stdin: asyncio.BaseTransport | None) -> None:
        super().__init__()
        self._program = program
        self._stdin = stdin

    def get_pid(self) -> int:
        return self._program.session_pid or 0

    def get_returncode(self) -> int | None:
        return self._program.returncode()

    def get_pipe_transport(self, fd: int) -> asyncio.BaseTransport | None:
        return self._stdin if fd == 0 else None

    def send_signal(self, signal: int) -> None:
        self._program._signal_group(signal)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def close(self) -> None:
        if self._stdin is not None:
            self._stdin.close()

    def is_closing(self) -> bool:
        return self._stdin is None or self._stdin.is_closing()


class SessionProgram(SupervisedProcess):
    """A program a session's supervisor started: supervised like a host process (deadline, output caps, group
    kill, marker sweep, attach, pty), its process group signalled through the supervisor.

    Its ``pid`` is the one it has in the session (what ``ps`` there shows). If the session breaks, its
    :meth:`wait` raises the session's :class:`~execspace.errors.BackendError`.

    A run without stdin, terminal or streaming (most runs) ``captures``: the supervisor makes its stdio and
    forwards its output on the session's channel, which spares the host two socketpairs, their registrations on
    the event loop and the ``SCM_RIGHTS`` hand-over per run; the other runs get stdio sockets from the host.
    """

    def __init__(
        self,
        launch: Launch,
        *,
        session: Session,
        rlimits: Sequence[tuple[int, int, int]] = (),
        run_dir: str | None = None,
        make_run_dir: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(launch)
        self._session = session
        self._rlimits = rlimits
        self._make_run_dir = make_run_dir
        la = launch
        self.captures = la.pty is None and la.stdin is None and not la.interactive
        self.run_dir = run_dir
        """The run's directory as the session sees it, while the supervisor is to make it: only for a run that
        ``captures`` (whose start can be asked again: it hands over no fds); the host makes the others'."""
        self.session_pid: int | None = None
        self._status: int | None = None
        self._group_left = True
        self._ended = False
        self._error: BackendError | None = None
        self._floor = 0
        self._watched: asyncio.Future[RunResult] | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._winding: asyncio.Task[RunResult] | None = None
        self.output_id = 0
        """The id the session's supervisor names this program's output by (``captures``)."""

    @property
    def pid(self) -> int | None:
        return self.session_pid

    async def _open_transport(self) -> asyncio.SubprocessTransport:
        loop = asyncio.get_running_loop()
        la = self._launch
        stdin: asyncio.BaseTransport | None = None
        if self.run_dir is not None and not self.captures:
            self._made_run_dir()
        if la.pty is not None:
            slave = self._open_pty(la.pty)
            child = [slave, os.dup(slave), os.dup(slave)]
            self._open_pipes = {1}
        elif self.captures:
            child = []
        else:
            child, stdin = await self._socket_stdio(loop)
        # the floor of a host-wide sweep, needed only when the session's tree cannot be walked
        self._floor = last_pid() if self._session.supervisor_pid is None else 0
        try:
            self.session_pid = await self._session.spawn(
                self, la.argv, la.env, la.cwd, child, self._rlimits, ctty=la.pty is not None
            )
        except RunDirFailed:
            # the host's confined walk makes it then (runs/ again if it went), or says why it cannot (a symlink);
            # a run that captures handed over no fds: its start is asked again as it was
            self._made_run_dir()
            return await self._open_transport()
        except BackendError:
            if self._session.broken is not None:
                self._close_stdio(stdin)
                raise
            self.session_ended(None)  # ended (workspace cleanup) while this run started: killed with it
        except BaseException:
            self._close_stdio(stdin)
            raise
        if la.pty is not None:
            await self._connect_pty(loop)
        return _SessionTransport(self, stdin)

    async def _socket_stdio(self, loop: asyncio.AbstractEventLoop) -> tuple[list[int], asyncio.BaseTransport | None]:
        la = self._launch
        child: list[int] = []
        stdin: asyncio.BaseTransport | None = None
        try:
            if la.stdin is not None or la.interactive:
                ours, theirs = socket.socketpair()
                child.append(theirs.detach())
                stdin, _ = await loop.connect_write_pipe(asyncio.Protocol, ours)
            else:
                child.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            for fd in (1, 2):
                ours, theirs = socket.socketpair()
                child.append(theirs.detach())
                self._readers[fd] = _SocketReader(loop, ours, self, fd)
        except BaseException:
            close_all(child)
            self._close_stdio(stdin)
            raise
        return child, stdin

    def _made_run_dir(self) -> None:
        self.run_dir = None
        if self._make_run_dir is not None:
            self._make_run_dir()

    def _close_stdio(self, stdin: asyncio.BaseTransport | None) -> None:
        for pipe in (stdin, *self._readers.values()):
            if pipe is not None:
                pipe.close()
        self._close_pty()

    # -- what the session reports -------------------------------------------------------------

    def reported_exit(self, status: int, *, group_left: bool) -> None:
        self._status = status
        self._group_left = group_left
        self._exited.set()
        self._settle()

    def session_ended(self, error: BackendError | None) -> None:
        """The session is over (closed, or broken with ``error``): so is this program."""
        self._ended = True
        self._error = error
        self._exited.set()
        self.end_output()
        self._settle()

    def output_open(self, fd: int) -> bool:
        """Whether the supervisor may still forward output ``fd`` (1 or 2) of this program."""
        return self.captures and fd in self._open_pipes

    def output(self, fd: int, data: bytes) -> None:
        self._on_data(fd, data)

    def output_ended(self, fd: int) -> None:
        self._on_pipe_closed(fd)
        self._settle()

    def end_output(self) -> None:
        """No more output will come (the session is over)."""
        if self.captures:
            for fd in sorted(self._open_pipes):
                self._on_pipe_closed(fd)

    def returncode(self) -> int | None:
        if self._status is not None:
            return os.waitstatus_to_exitcode(self._status)
        return -signal.SIGKILL if self._ended else None

    # -- supervision through the session -------------------------------------------------------

    def _watch(self) -> asyncio.Future[RunResult] | None:
        # a run that captures (most runs) ends in one message of the supervisor, EXITED, saying its output
        # ended too: that message finishes it, with no task of its own (the caller is one loop turn from its
        # result), and its deadline is a timer
        if not self.captures or self._session.supervisor_pid is None:
            return None
        loop = asyncio.get_running_loop()
        self._watched = loop.create_future()
        if self._launch.timeout is not None:
            self._deadline = loop.call_later(self._launch.timeout, self._ran_out)
        self._settle()
        return self._watched

    def _settle(self) -> None:
        """After an event of a watched run: if it ended, finish it now (its leftovers are swept at once: a watched
        run's session has a supervisor pid), or in a task when its output outlives it (held by a descendant that
        left its group)."""
        done = self._watched
        if done is None or done.done() or self._winding is not None or not self._exited.is_set():
            return
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        try:
            now = self._pipes_closed.is_set() and self._swept_at_once()
            if now:
                done.set_result(self._finish(timed_out=False))
        except Exception as exc:  # its caller's, not the session's whose message this is
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

    def _signal_group(self, sig: int) -> None:
        # also after the leader's exit: what is left of its group does not outlive the run (the supervisor says
        # whether anything is: a group without members cannot get any)
        if self.session_pid is not None and (self._status is None or self._group_left):
            self._session.signal(self.session_pid, sig, group=True)

    async def signal(self, sig: int) -> None:
        if self.session_pid is not None and not self._exited.is_set():
            self._session.signal(self.session_pid, sig, group=True)

    async def _killed(self) -> None:
        # the supervisor reports the end of a SIGKILLed program at once; one that says nothing is broken or lying,
        # and must not hold this caller forever: the session ends, and with it this program
        try:
            async with asyncio.timeout(self._session.config.request_timeout):
                await self._exited.wait()
        except TimeoutError:
            self._session.fail(f"did not report the end of program {self.session_pid} after SIGKILL")
            await self._exited.wait()

    def _terminate(self) -> bool:
        # the supervisor started it (or never will): the TERM goes through the session, never to a host pid
        if self.session_pid is None or self._exited.is_set():
            return False
        self._session.signal(self.session_pid, signal.SIGTERM, group=True)
        return True

    def _swept_at_once(self) -> bool:
        supervisor = self._session.supervisor_pid
        if supervisor is None:
            return False
        self._signal_group(signal.SIGKILL)
        kill_marked_children(supervisor, self._launch.marker, self._session.children)
        return True

    async def _sweep(self) -> None:
        supervisor = self._session.supervisor_pid
        if supervisor is not None:
            kill_marked_children(supervisor, self._launch.marker, self._session.children)
        elif (sweeper := self._launch.sweeper) is not None:
            await sweeper.sweep(self._launch.marker, self._floor)

    async def wait(self) -> RunResult:
        result = await super().wait()
        if self._error is not None:
            raise self._error
        return result
