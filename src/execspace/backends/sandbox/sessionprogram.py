"""The transport of a program a session's supervisor starts (:class:`SessionTransport`): a
:class:`~execspace.process.supervisor.SupervisedProcess` supervises it as it does a host process, reaching it
through the session's channel; and the readers that stand for its stdio sockets on the host."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Callable, Sequence

from ...errors import BackendError
from ...process.supervisor import Launch, SupervisedProcess, Terminal
from .session import RunDirFailed, Session, close_all
from .sessiontree import kill_marked_children, last_pid

__all__ = ["SessionTransport"]

_READ_SIZE = 256 * 1024


class _SocketReader(asyncio.ReadTransport):
    """The host's reading end of one of a program's output sockets, on the event loop as it is (no transport
    set-up round trip per run): data to the process's ``received``, end of file to its ``output_ended``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, owner: SupervisedProcess, fd: int) -> None:
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
            self._owner.received(self._fd, data)
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
        self._owner.output_ended(self._fd)


class SessionTransport:
    """The transport of a program a session's supervisor starts (a spawner's, chosen once per run): its
    :class:`~execspace.process.supervisor.SupervisedProcess` supervises it like a host process (deadline, output
    caps, group kill, marker sweep, attach, pty), its process group signalled through the supervisor.

    Its ``pid`` is the one it has in the session (what ``ps`` there shows). If the session breaks, the process's
    ``wait`` raises the session's :class:`~execspace.errors.BackendError` (``error``).

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
        self._launch = launch
        self._session = session
        self._rlimits = rlimits
        self._make_run_dir = make_run_dir
        self._proc: SupervisedProcess | None = None
        self.readers: dict[int, asyncio.ReadTransport] = {}
        self.terminal: Terminal | None = None
        self._stdin: asyncio.WriteTransport | None = None
        la = launch
        self.captures = la.pty is None and la.stdin is None and not la.interactive
        self.run_dir = run_dir
        """The run's directory as the session sees it, while the supervisor is to make it: only for a run that
        ``captures`` (whose start can be asked again: it hands over no fds); the host makes the others'."""
        self.session_pid: int | None = None
        self._status: int | None = None
        self._group_left = True
        self._ended = False
        self.error: BaseException | None = None
        self._floor = 0
        self.output_id = 0
        """The id the session's supervisor names this program's output by (``captures``)."""

    @property
    def pid(self) -> int | None:
        return self.session_pid

    @property
    def watched(self) -> bool:
        # a run that captures (most runs) ends in one message of the supervisor, EXITED, saying its output
        # ended too: that message finishes it, with no task of its own
        return self.captures and self._session.supervisor_pid is not None

    async def open(self, proc: SupervisedProcess) -> None:
        self._proc = proc
        loop = asyncio.get_running_loop()
        la = self._launch
        if self.run_dir is not None and not self.captures:
            self._made_run_dir()
        if la.pty is not None:
            self.terminal = Terminal(la.pty)
            slave = self.terminal.slave
            child = [slave, os.dup(slave), os.dup(slave)]
            proc.expect_output({1})
        elif self.captures:
            child = []
        else:
            child = await self._socket_stdio(loop, proc)
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
            return await self.open(proc)
        except BackendError:
            if self._session.broken is not None:
                self._close_stdio()
                raise
            self.session_ended(None)  # ended (workspace cleanup) while this run started: killed with it
        except BaseException:
            self._close_stdio()
            raise
        if self.terminal is not None:
            self.readers[1] = await self.terminal.connect(proc)

    async def _socket_stdio(self, loop: asyncio.AbstractEventLoop, proc: SupervisedProcess) -> list[int]:
        la = self._launch
        child: list[int] = []
        try:
            if la.stdin is not None or la.interactive:
                ours, theirs = socket.socketpair()
                child.append(theirs.detach())
                self._stdin, _ = await loop.connect_write_pipe(asyncio.Protocol, ours)
            else:
                child.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            for fd in (1, 2):
                ours, theirs = socket.socketpair()
                child.append(theirs.detach())
                self.readers[fd] = _SocketReader(loop, ours, proc, fd)
        except BaseException:
            close_all(child)
            self._close_stdio()
            raise
        return child

    def _made_run_dir(self) -> None:
        self.run_dir = None
        if self._make_run_dir is not None:
            self._make_run_dir()

    def _close_stdio(self) -> None:
        for pipe in (self._stdin, *self.readers.values()):
            if pipe is not None:
                pipe.close()
        if self.terminal is not None:
            self.terminal.close()

    def returncode(self) -> int | None:
        if self._status is not None:
            return os.waitstatus_to_exitcode(self._status)
        return -signal.SIGKILL if self._ended else None

    def stdin(self) -> asyncio.WriteTransport | None:
        return self.terminal.writer if self.terminal is not None else self._stdin

    def close(self) -> None:
        for pipe in (self._stdin, *self.readers.values(), self.terminal.writer if self.terminal else None):
            if pipe is not None:
                pipe.close()

    # -- what the session reports -------------------------------------------------------------

    def reported_exit(self, status: int, *, group_left: bool) -> None:
        self._status = status
        self._group_left = group_left
        assert self._proc is not None
        self._proc.program_exited()
        self._proc.settle()

    def session_ended(self, error: BackendError | None) -> None:
        """The session is over (closed, or broken with ``error``): so is this program."""
        self._ended = True
        self.error = error
        assert self._proc is not None
        self._proc.program_exited()
        self.end_output()
        self._proc.settle()

    def output_open(self, fd: int) -> bool:
        """Whether the supervisor may still forward output ``fd`` (1 or 2) of this program."""
        return self.captures and self._proc is not None and self._proc.output_open(fd)

    def output(self, fd: int, data: bytes) -> None:
        assert self._proc is not None
        self._proc.received(fd, data)

    def output_ended(self, fd: int) -> None:
        assert self._proc is not None
        self._proc.output_ended(fd)
        self._proc.settle()

    def end_output(self) -> None:
        """No more output will come (the session is over)."""
        if self.captures and self._proc is not None:
            for fd in (1, 2):
                if self._proc.output_open(fd):
                    self._proc.output_ended(fd)

    # -- reaching it through the session -------------------------------------------------------

    @property
    def _exited(self) -> bool:
        return self._proc is not None and self._proc.exited

    def signal_group(self, sig: int) -> None:
        # also after the leader's exit: what is left of its group does not outlive the run (the supervisor says
        # whether anything is: a group without members cannot get any)
        if self.session_pid is not None and (self._status is None or self._group_left):
            self._session.signal(self.session_pid, sig, group=True)

    async def signal(self, sig: int) -> None:
        if self.session_pid is not None and not self._exited:
            self._session.signal(self.session_pid, sig, group=True)

    async def killed(self) -> None:
        # the supervisor reports the end of a SIGKILLed program at once; one that says nothing is broken or lying,
        # and must not hold this caller forever: the session ends, and with it this program
        assert self._proc is not None
        try:
            async with asyncio.timeout(self._session.config.request_timeout):
                await self._proc.wait_exited()
        except TimeoutError:
            self._session.fail(f"did not report the end of program {self.session_pid} after SIGKILL")
            await self._proc.wait_exited()

    def terminate(self) -> bool:
        # the supervisor started it (or never will): the TERM goes through the session, never to a host pid
        if self.session_pid is None or self._exited:
            return False
        self._session.signal(self.session_pid, signal.SIGTERM, group=True)
        return True

    def swept_at_once(self) -> bool:
        supervisor = self._session.supervisor_pid
        if supervisor is None:
            return False
        self.signal_group(signal.SIGKILL)
        kill_marked_children(supervisor, self._launch.marker, self._session.children)
        return True

    async def sweep(self) -> None:
        supervisor = self._session.supervisor_pid
        if supervisor is not None:
            kill_marked_children(supervisor, self._launch.marker, self._session.children)
        elif (sweeper := self._launch.sweeper) is not None:
            await sweeper.sweep(self._launch.marker, self._floor)
