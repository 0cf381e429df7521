"""Sandbox sessions: one long-lived sandbox per workspace, whose programs a supervisor inside it starts.

A session is one bwrap, built by the same command line as a per-run sandbox (:func:`.bwrap.build_argv`: the
same namespaces, mounts, seccomp filter, uid and cgroup), whose program is the supervisor (``supervisor.c``,
built by :mod:`.supervisorbin`) running as PID 1 of the sandbox's PID namespace. The host talks to it over an
inherited ``SOCK_SEQPACKET`` socketpair, nothing a program can open. The supervisor forks, execs and answers with
the pid (or the exec's errno: 127/126 as every backend reports them), reports exits and signals process groups on
request. A run's stdio: for a run without stdin or terminal (``run_program`` of most calls), the supervisor
makes it (``/dev/null`` and two socketpairs) and forwards the output to the host in messages on the channel, the
end of the output in the exit's message (one message for a run that printed nothing); for the others (stdin,
``start_program``, a pty) the host makes it and passes the program's ends with ``SCM_RIGHTS``, and output goes
from the program straight to the host, never through the supervisor.

Why socketpairs and not pipes: the programs of a session share a uid, and a pipe can be opened again through
``/proc/<pid>/fd`` by any process of that uid (stealing another run's stdin or output); a socket cannot.

The host trusts nothing the supervisor says (:class:`Session`): every message is one packet of a known kind and
size (a 16-byte head, as ``supervisorprotocol.h`` lays it out; output: at most 64 KiB more, within the run's
output cap as any output) that answers an open request or reports a program it started (output: one whose output
has not ended), within ``request_timeout``; anything else ends that session, with a
:class:`~execspace.errors.BackendError` its runs report. A run's timeout signals its process group through the
supervisor, and its escaped descendants are found by their run marker from the host (as in per-run mode), so a run
never ends the session.

The modules of a session: :mod:`.protocol` (the channel's numbers and layout, from ``supervisorprotocol.h``), this
one (a session's life: its start, its requests, what the supervisor says), :mod:`.sessionprogram` (a program it
started, as a supervised process), :mod:`.sessiontree` (its processes in ``/proc``), :mod:`.sessionconfig` (its
configuration and limits); the runner that pools and idles them is :mod:`.sessionrunner`.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import itertools
import os
import signal
import socket
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ...errors import BackendError, InvalidSpec
from ...process.supervisor import Launch, SupervisedProcess, spawn
from .protocol import (
    EXITED_ENDED,
    EXITED_GROUP_LEFT,
    FLAG_CAPTURE,
    FLAG_CTTY,
    FLAG_RUN_DIR,
    MAX_REQUEST,
    MESSAGE_HEAD,
    MSG_CLOSED,
    MSG_EXITED,
    MSG_LISTENING,
    MSG_OUTPUT,
    MSG_READY,
    MSG_SIGNALED,
    MSG_SPAWNED,
    OP_LISTEN,
    OP_SIGNAL,
    OP_SPAWN,
    OUT_CHUNK,
    REQUEST_HEAD,
    SIGNAL_BODY,
    SPAWNED_NO_RUN_DIR,
    encode_spawn,
)
from .sessionconfig import SessionConfig
from .sessiontree import only_child, open_children

__all__ = ["MAX_REQUEST", "RunDirFailed", "Session", "SessionClient", "close_all", "start_session"]

_FD_SIZE = array.array("i").itemsize
#: Messages read per wake-up of the channel: a program that floods its output cannot hold the event loop (and
#: the deadlines on it) for longer than that.
_READS_PER_TURN = 64
_CUT = int(socket.MSG_TRUNC | socket.MSG_CTRUNC)  # an int: the flags enum's operators cost a run microseconds
_ANCILLARY = socket.CMSG_SPACE(_FD_SIZE)
_SEND_BUFFER = 2 * MAX_REQUEST
_DATAGRAM_OVERHEAD = 64 * 1024
_MAX_ERRNO = 4095
_LAST_WORDS = 2.0  # seconds to wait for bwrap's exit (and its error) after a session failed to start


class SessionClient(Protocol):
    """What a session needs of a program it started (:class:`~.sessionprogram.SessionTransport`)."""

    captures: bool
    """The supervisor makes its stdio and forwards its output on the channel."""
    run_dir: str | None
    """The run's directory, while the supervisor is to make it."""
    output_id: int
    """The id of the request that started it, which its output is named by."""

    def output_open(self, fd: int) -> bool: ...
    def output(self, fd: int, data: bytes) -> None: ...
    def output_ended(self, fd: int) -> None: ...
    def reported_exit(self, status: int, *, group_left: bool) -> None: ...
    def session_ended(self, error: BackendError | None) -> None: ...


class Session:
    """The host side of one session's supervisor: its channel, its requests and the programs it started."""

    def __init__(self, sock: socket.socket, name: str, config: SessionConfig) -> None:
        self.name = name
        self.config = config
        self._sock = sock
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
        buffer = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        self.max_request = min(MAX_REQUEST, buffer - _DATAGRAM_OVERHEAD)
        """Largest spawn request this session's channel takes in one datagram."""
        self._loop = asyncio.get_running_loop()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[int, asyncio.Future[tuple[int, int]], SessionClient | None]] = {}
        self._due: dict[int, float] = {}
        """When each pending request must be answered by (oldest first, as they were sent)."""
        self._watchdog: asyncio.TimerHandle | None = None
        self._abandoned: dict[int, SessionClient | None] = {}
        """Requests whose caller was cancelled (and their program): their answer is expected, and dropped."""
        self._unclaimed: dict[int, SessionClient | None] = {}
        """Programs started for an abandoned request (killed), by pid: their exit is expected, and dropped."""
        self._programs: dict[int, SessionClient] = {}
        self._outputs: dict[int, SessionClient] = {}
        """Programs whose output the supervisor forwards (``capture``), by the id of the request that started
        them, until both their outputs ended: the output of an exited program's leftovers still comes."""
        self._ready: asyncio.Future[None] = self._loop.create_future()
        self._outbox: deque[tuple[bytes, list[int]]] = deque()
        self._writing = False
        """Waiting for the channel to take more (a writer is on the loop)."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self.broken: BackendError | None = None
        self.closed = False
        self.bwrap: SupervisedProcess | None = None
        self.supervisor_pid: int | None = None
        """The supervisor's pid on the host (its pid in the session is 1)."""
        self.children: int | None = None
        """An fd of the supervisor's ``/proc/<pid>/task/<pid>/children``, read again (``pread``) by each run's
        sweep: one system call, and never another process's list after its pid is reused."""
        self.active = 0
        """Programs started and not yet over (the runner's idle timer runs while there are none)."""
        self.idle_timer: asyncio.TimerHandle | None = None
        self.idle_since = 0.0
        """Event-loop time the session's last program ended (while ``active`` is 0)."""
        self.owner: tuple[int, int] | None = None
        """The uid/gid its programs run as, when it differs from ours (as root)."""
        self._loop.add_reader(sock.fileno(), self._readable)

    @property
    def usable(self) -> bool:
        return self.broken is None and not self.closed

    # -- start and end -------------------------------------------------------------------

    async def started(self, bwrap: SupervisedProcess) -> None:
        """Wait until the supervisor in ``bwrap`` says it is ready.

        Raises:
            BackendError: bwrap or the supervisor exited first, or the start took longer than ``start_timeout``.
        """
        self.bwrap = bwrap
        exited = asyncio.ensure_future(bwrap.wait())
        try:
            waited: set[asyncio.Future[Any]] = {self._ready, exited}
            await asyncio.wait(waited, timeout=self.config.start_timeout, return_when="FIRST_COMPLETED")
            if self._ready.done() and self._ready.exception() is None:
                self.supervisor_pid = only_child(bwrap.pid)
                self.children = open_children(self.supervisor_pid)
                return
            # its channel may close before bwrap is reaped: bwrap's last words say why
            await asyncio.wait({exited}, timeout=_LAST_WORDS)
        finally:
            if not exited.done():
                exited.cancel()
        if exited.done() and not exited.cancelled() and exited.exception() is None:
            err = exited.result().stderr.strip().splitlines()[-1:] or [f"exit code {exited.result().exit_code}"]
            reason = f"did not start: {err[0]}"
        else:
            reason = f"was not ready within {self.config.start_timeout} s"
        if self.broken is None:
            self.fail(reason)
        else:
            self.broken = self._error(reason)  # says more than the channel's EOF did
        assert self.broken is not None
        raise self.broken

    async def close(self) -> None:
        """End the session: every process in it is killed (the supervisor is its PID namespace's init) and the
        host waits until bwrap is reaped. Idempotent."""
        if not self.closed:
            self.closed = True
            if self.idle_timer is not None:
                self.idle_timer.cancel()
            self._shutdown_channel(None)
        await self._kill()

    async def _kill(self) -> None:
        children, self.children = self.children, None
        if children is not None:
            os.close(children)
        if self.supervisor_pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.supervisor_pid, signal.SIGKILL)
        if self.bwrap is not None:
            await self.bwrap.kill_now()

    def fail(self, reason: str) -> None:
        """The supervisor broke the protocol, hung or died: end this session, and tell its programs why."""
        if not self.usable:
            return
        self.broken = self._error(reason)
        self._shutdown_channel(self.broken)
        task = self._loop.create_task(self._kill())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _error(self, reason: str) -> BackendError:
        return BackendError(
            f"sandbox session of workspace {self.name!r}: its supervisor {reason}; the session was ended and "
            "its programs killed. The next run starts a new session; if this repeats, use mode='per-run'"
        )

    def _shutdown_channel(self, error: BackendError | None) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._sock.fileno())
            self._loop.remove_writer(self._sock.fileno())
        for _, fut, _ in self._pending.values():
            if not fut.done():
                fut.set_exception(error or BackendError(f"sandbox session of workspace {self.name!r} was ended"))
                fut.exception()  # its requester is told by _request, or has gone
        self._pending.clear()
        self._due.clear()
        for _, fds in self._outbox:
            close_all(fds)
        self._outbox.clear()
        programs, self._programs = list(self._programs.values()), {}
        for program in programs:
            program.session_ended(error)
        outputs, self._outputs = list(self._outputs.values()), {}
        for program in outputs:
            program.session_ended(error)  # exited before: its leftovers' output ended with the session
        self._sock.close()

    # -- requests -------------------------------------------------------------------------

    async def spawn(
        self,
        program: SessionClient,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        fds: list[int],
        rlimits: Sequence[tuple[int, int, int]],
        *,
        ctty: bool = False,
    ) -> int:
        """Start ``argv`` with ``fds`` as its stdin, stdout and stderr (taken over: closed once sent); its pid in
        the session. Without ``fds`` (``program.captures``), the supervisor makes them, and forwards the output to
        ``program``; with ``program.run_dir``, it makes that directory first.

        Raises:
            RunDirFailed: the supervisor could not make ``program.run_dir``.
            OSError: the exec failed (its errno).
            BackendError: the session is over or broke.
            InvalidSpec: argv and environment are too large for one request.
        """
        run_dir = program.run_dir
        strings = [cwd, *argv, *(f"{k}={v}" for k, v in env.items())]
        if run_dir is not None:
            strings.insert(1, run_dir)
        flags = (FLAG_CTTY if ctty else 0) | (FLAG_CAPTURE if program.captures else 0)
        flags |= FLAG_RUN_DIR if run_dir is not None else 0
        body = encode_spawn(flags, rlimits, strings, len(argv), len(env))
        if len(body) > self.max_request:
            close_all(fds)
            raise InvalidSpec(
                f"the arguments and environment of a session run take {len(body)} bytes, more than "
                f"{self.max_request}; pass large data through stdin or a file, or use mode='per-run'"
            )
        pid, err = await self._request(OP_SPAWN, MSG_SPAWNED, body, fds, program)
        if pid == SPAWNED_NO_RUN_DIR:
            raise RunDirFailed(err, os.strerror(err), run_dir)
        if err:
            raise OSError(err, os.strerror(err), argv[0])
        return pid

    def signal(self, pid: int, sig: int, *, group: bool) -> None:
        """Ask for ``sig`` to ``pid`` (its process group with ``group``), without waiting for the answer."""
        if not self.usable:
            return
        request = self._request(OP_SIGNAL, MSG_SIGNALED, SIGNAL_BODY.pack(pid, sig, int(group)), [])
        task = self._loop.create_task(request)
        self._tasks.add(task)
        task.add_done_callback(_forget(self._tasks))

    async def listener(self) -> socket.socket:
        """A TCP socket listening on ``127.0.0.1`` of the session's network namespace (a free port), for one run's
        egress proxy.

        Raises:
            OSError: the supervisor could not make it (its errno).
            BackendError: the session is over or broke.
        """
        fd, err = await self._request(OP_LISTEN, MSG_LISTENING, b"", [])
        if err:
            raise OSError(err, os.strerror(err), "listening on the session's loopback")
        return socket.socket(fileno=fd)

    async def _request(
        self, op: int, kind: int, body: bytes, fds: list[int], program: SessionClient | None = None
    ) -> tuple[int, int]:
        if not self.usable:
            close_all(fds)
            raise self.broken or BackendError(f"sandbox session of workspace {self.name!r} was ended")
        ident = next(self._ids) & 0xFFFF_FFFF
        fut: asyncio.Future[tuple[int, int]] = self._loop.create_future()
        self._pending[ident] = (kind, fut, program)
        self._due[ident] = due = self._loop.time() + self.config.request_timeout
        if self._watchdog is None:
            self._watchdog = self._loop.call_at(due, self._overdue)
        self._send(REQUEST_HEAD.pack(op, ident) + body, fds)
        try:
            # not shielded (one loop turn less): a request given up is answered all the same, and dropped
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._disown(kind, *fut.result())  # answered, but its caller has gone
            elif ident in self._pending:
                self._abandoned[ident] = program
            raise
        finally:
            self._pending.pop(ident, None)
            self._due.pop(ident, None)

    def _overdue(self) -> None:
        """The watchdog of every pending request (one timer, not one per request): the oldest one unanswered
        past ``request_timeout`` ends the session; else it looks again when the oldest is due."""
        self._watchdog = None
        due = next(iter(self._due.values()), None)
        if due is None or not self.usable:
            return
        if due <= self._loop.time():
            self.fail(f"did not answer within {self.config.request_timeout} s (stopped or hung)")
        else:
            self._watchdog = self._loop.call_at(due, self._overdue)

    def _disown(self, kind: int, pid: int, err: int) -> None:
        if kind == MSG_LISTENING and err == 0:
            os.close(pid)  # the listener's fd: asked for by a caller who has gone
        if kind == MSG_SPAWNED and err == 0 and (program := self._programs.pop(pid, None)) is not None:
            self._unclaimed[pid] = program
            self.signal(pid, signal.SIGKILL, group=True)  # started for a caller who has gone

    def _send(self, data: bytes, fds: list[int]) -> None:
        self._outbox.append((data, fds))
        self._flush()

    def _flush(self) -> None:
        while self._outbox and self.usable:
            data, fds = self._outbox[0]
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
            try:
                self._sock.sendmsg([data], anc)
            except BlockingIOError:
                self._loop.add_writer(self._sock.fileno(), self._flush)
                self._writing = True
                return
            except OSError as exc:
                self.fail(f"channel failed ({exc.strerror})")
                return
            self._outbox.popleft()
            close_all(fds)
        if self._writing:  # only once the channel was full: most requests go out at once
            self._writing = False
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_writer(self._sock.fileno())

    # -- what the supervisor says -----------------------------------------------------------

    def _readable(self) -> None:
        for _ in range(_READS_PER_TURN):
            if not self.usable:
                return
            try:
                # room for one fd (a listener); more are discarded by the kernel (MSG_CTRUNC)
                data, anc, flags, _ = self._sock.recvmsg(
                    MESSAGE_HEAD.size + OUT_CHUNK + 1, _ANCILLARY, socket.MSG_CMSG_CLOEXEC
                )
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.fail(f"channel failed ({exc.strerror})")
                return
            fds = (
                [
                    fd
                    for level, what, raw in anc
                    if (level, what) == (socket.SOL_SOCKET, socket.SCM_RIGHTS)
                    for fd in array.array("i", raw[: len(raw) - len(raw) % _FD_SIZE])
                ]
                if anc
                else []
            )
            if not data:
                close_all(fds)
                self.fail("exited")
                return
            size = len(data)
            if flags & _CUT or size < MESSAGE_HEAD.size:
                close_all(fds)
                self.fail(f"sent a malformed message ({size} bytes, flags {flags:#x})")
                return
            kind, ident, a, b = MESSAGE_HEAD.unpack_from(data)
            # only OUTPUT carries more than the head: at least one byte, at most OUT_CHUNK
            if (size > MESSAGE_HEAD.size) != (kind == MSG_OUTPUT) or size > MESSAGE_HEAD.size + OUT_CHUNK:
                close_all(fds)
                self.fail(f"sent a malformed message (kind {kind}, {size} bytes)")
                return
            problem = self._dispatch(kind, ident, a, b, data, fds)
            if problem is not None:
                close_all(fds)
                self.fail(problem)
                return

    def _dispatch(self, kind: int, ident: int, a: int, b: int, data: bytes, fds: list[int]) -> str | None:
        """Act on one message (``data``: the whole of it; ``fds``: those it carried, taken over when it is fine);
        what is wrong with it, if anything."""
        if len(fds) != (kind == MSG_LISTENING and b == 0):
            return f"sent {len(fds)} fds with message kind {kind}"
        if kind == MSG_LISTENING:
            return self._listening(ident, a, b, fds)
        if not self._ready.done():
            if (kind, ident, a, b) != (MSG_READY, 0, 0, 0):
                return f"sent message kind {kind} before it was ready"
            self._ready.set_result(None)
            return None
        if kind in (MSG_OUTPUT, MSG_CLOSED):
            program = self._outputs.get(ident)
            if program is None or b != 0 or not program.output_open(a):
                return f"sent output of a program it was not running, or after its end (id {ident}, fd {a})"
            if kind == MSG_OUTPUT:
                program.output(a, data[MESSAGE_HEAD.size :])
            else:
                self._output_ended(ident, program, a)
            return None
        if kind == MSG_EXITED:
            return self._exited(ident, a, b)
        if kind in (MSG_SPAWNED, MSG_SIGNALED) and ident in self._abandoned:
            program = self._abandoned.pop(ident)
            if kind == MSG_SPAWNED and b == 0 and a > 1 and a not in self._programs and a not in self._unclaimed:
                self._unclaimed[a] = program
                if program is not None and program.captures:
                    self._outputs[ident] = program
                    program.output_id = ident
                self.signal(a, signal.SIGKILL, group=True)  # started for a caller who has gone
            return None
        want, fut, program = self._pending.get(ident, (0, None, None))
        if fut is None or want != kind or fut.done():
            return f"answered a request it was not asked (kind {kind}, id {ident})"
        started = b == 0 and a > 1 and a not in self._programs and a not in self._unclaimed
        no_dir = a == SPAWNED_NO_RUN_DIR and program is not None and program.run_dir
        failed = 0 < b <= _MAX_ERRNO and (a == 0 or no_dir)
        if kind == MSG_SPAWNED and not (failed or started):
            return f"answered a start with an impossible pid/errno ({a}, {b})"
        if kind == MSG_SIGNALED and not (0 <= a <= _MAX_ERRNO and b == 0):
            return f"answered a signal with an impossible errno ({a}, {b})"
        if kind == MSG_SPAWNED and b == 0 and program is not None:
            self._programs[a] = program
            if program.captures:
                self._outputs[ident] = program
                program.output_id = ident
        fut.set_result((a, b))
        return None

    def _listening(self, ident: int, port: int, err: int, fds: list[int]) -> str | None:
        if not (0 < port < 65536 and err == 0) and not (port == 0 and 0 < err <= _MAX_ERRNO):
            return f"answered a listen with an impossible port/errno ({port}, {err})"
        if ident in self._abandoned:
            del self._abandoned[ident]
            close_all(fds)
            return None
        want, fut, _ = self._pending.get(ident, (0, None, None))
        if fut is None or want != MSG_LISTENING or fut.done():
            return f"answered a request it was not asked (kind {MSG_LISTENING}, id {ident})"
        fut.set_result((fds[0], 0) if fds else (-1, err))
        return None

    def _exited(self, flags: int, pid: int, status: int) -> str | None:
        unclaimed = pid in self._unclaimed
        program = self._unclaimed.pop(pid) if unclaimed else self._programs.pop(pid, None)
        if (program is None and not unclaimed) or not _valid_status(status):
            return f"reported the exit of a program it was not running (pid {pid}, status {status})"
        ended = [fd for fd, bit in EXITED_ENDED.items() if flags & bit]
        captures = program is not None and program.captures
        if flags & ~(EXITED_GROUP_LEFT | (sum(EXITED_ENDED.values()) if captures else 0)):
            return f"reported the exit of program {pid} with unknown flags {flags:#x}"
        if program is not None and any(not program.output_open(fd) for fd in ended):
            return f"reported the end of an output of program {pid} that had ended"
        for fd in ended:
            assert program is not None
            self._output_ended(program.output_id, program, fd)
        if program is not None and not unclaimed:
            # after its output's end: the exit of a run whose output ended finishes it at once
            program.reported_exit(status, group_left=bool(flags & EXITED_GROUP_LEFT))
        return None

    def _output_ended(self, ident: int, program: SessionClient, fd: int) -> None:
        program.output_ended(fd)
        if not program.output_open(1) and not program.output_open(2):
            self._outputs.pop(ident, None)


class RunDirFailed(OSError):
    """The supervisor could not make a run's directory (``runs/`` gone, a symlink, not writable): the host makes
    it then, or says why it cannot."""


def _valid_status(status: int) -> bool:
    try:
        os.waitstatus_to_exitcode(status)
    except ValueError:
        return False
    return status >= 0


def close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _forget(tasks: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # a failed signal ended the session already; nothing more to say

    return done


async def start_session(
    launch: Launch, sock: socket.socket, name: str, config: SessionConfig, *, owner: tuple[int, int] | None = None
) -> Session:
    """Spawn the session's bwrap (``launch``, whose program is the supervisor on the other end of ``sock``)
    and wait until the supervisor is ready. ``owner``: the uid/gid the session runs as (as root), for the
    directories made for its runs.

    Raises:
        BackendError: it did not start (bwrap's error in the message), or bwrap could not be executed.
    """
    session = Session(sock, name, config)
    session.owner = owner
    try:
        bwrap = await spawn(launch)
    except BaseException as exc:
        session.closed = True
        session._shutdown_channel(None)
        if isinstance(exc, OSError):
            # not the run's program failing to start (a 127), but the sandbox around it
            raise session._error(f"could not be started: {exc}") from exc
        raise
    try:
        await session.started(bwrap)
    except BaseException:
        await session.close()
        raise
    return session
