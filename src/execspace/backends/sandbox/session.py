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
size (a 16-byte head; output: at most 64 KiB more, within the run's output cap as any output) that answers an
open request or reports a program it started (output: one whose output has not ended), within
``request_timeout``; anything else
ends that session, with a :class:`~execspace.errors.BackendError` its runs report. A run's timeout signals its
process group through the supervisor, and its escaped descendants are found by their run marker from the host
(as in per-run mode), so a run never ends the session.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import itertools
import os
import signal
import socket
import struct
from collections import deque
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import BackendError, InvalidSpec
from ...models import ResourceLimits, RunResult
from ...process.supervisor import RUN_MARKER_VAR, Launch, SupervisedProcess, spawn
from ...workspace.diskimages import MIN_DISK_BYTES

__all__ = ["MAX_REQUEST", "Session", "SessionConfig", "SessionProgram", "start_session"]

_MSG = struct.Struct("=IIii")
_HEAD = struct.Struct("=II")
_SPAWN = struct.Struct("=IIII")
_RLIMIT = struct.Struct("=IIQQ")
_SIGNAL = struct.Struct("=iiI")
_FD_SIZE = array.array("i").itemsize
_OP_SPAWN, _OP_SIGNAL, _OP_LISTEN = 1, 2, 3
_READY, _SPAWNED, _EXITED, _SIGNALED, _LISTENING, _OUTPUT, _CLOSED = 1, 2, 3, 4, 5, 6, 7
_FLAG_CTTY, _FLAG_CAPTURE, _FLAG_RUN_DIR = 1, 2, 4
_NO_RUN_DIR = -1  # SPAWNED's pid when the run directory could not be made
_GROUP_LEFT = 1
#: EXITED's flags for the end of a captured program's stdout (fd 1) and stderr (fd 2).
_ENDED = {1: 2, 2: 4}
#: Largest OUTPUT message: its head and at most this much output (``OUT_CHUNK`` in supervisor.c).
_OUT_CHUNK = 64 * 1024
#: Messages read per wake-up of the channel: a program that floods its output cannot hold the event loop (and
#: the deadlines on it) for longer than that.
_READS_PER_TURN = 64
_CUT = int(socket.MSG_TRUNC | socket.MSG_CTRUNC)  # an int: the flags enum's operators cost a run microseconds
_ANCILLARY = socket.CMSG_SPACE(_FD_SIZE)
#: Largest spawn request (argv, environment, cwd), as ``ARG_MAX`` is for an exec: less where the host's socket
#: buffers cannot take a datagram that large (``net.core.wmem_max``).
MAX_REQUEST = 2 * 1024 * 1024
_SEND_BUFFER = 2 * MAX_REQUEST
_DATAGRAM_OVERHEAD = 64 * 1024
_MAX_ERRNO = 4095
_READ_SIZE = 256 * 1024
_LAST_WORDS = 2.0  # seconds to wait for bwrap's exit (and its error) after a session failed to start


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """How a sandbox engine in session mode keeps its sessions."""

    pool_size: int = 2
    """Sessions started ahead on laid-out slots, so that a new workspace's first run does not wait for one."""
    idle_timeout: float | None = 300.0
    """Seconds a session without programs is kept before it is ended (the next run starts a new one)."""
    request_timeout: float = 10.0
    """Seconds the supervisor has to answer a request; past that the session is ended as hung."""
    start_timeout: float = 10.0
    """Seconds a new session has to report ready."""
    memory_bytes: int | None = None
    """Memory of the whole session (every program in it together, and its supervisor), as a cgroup where this host
    gives one (as root); else an rlimit of each of its processes. A program past it is killed by the kernel. The
    session's ``/tmp`` and ``/dev/shm`` (tmpfs, in memory) together hold at most this much."""
    pids: int | None = None
    """Processes and threads of the whole session at once, as a cgroup where this host gives one; else ``RLIMIT_NPROC``
    of its uid (not as root: its sessions' uids are per workspace, but root's rlimit would not hold)."""
    cpus: float | None = None
    """CPU bandwidth of the whole session, in CPUs (``0.5``: half of one CPU's time per wall second), as a cgroup
    CPU quota (v1 ``cpu.cfs_quota_us``, v2 ``cpu.max``): needs root and the cpu controller, refused otherwise.
    Past it the session's programs are throttled, never killed."""
    disk_bytes: int | None = None
    """Disk of each workspace, as a filesystem of that size of its own (a sparse ext4 image loop-mounted at the
    workspace, :mod:`execspace.workspace.diskimages`): a write past it fails with ``ENOSPC`` in the program. The
    session's ``/tmp`` and ``/dev/shm`` (tmpfs, in memory) together hold at most the same size. Needs root,
    ``mkfs.ext4`` and loop devices, refused otherwise; its workspaces have no snapshots or forks, and no sessions
    started ahead (``pool_size`` is not used)."""

    def __post_init__(self) -> None:
        self.limits(1)  # refused now as ResourceLimits refuses them, not when a session starts
        if self.disk_bytes is not None and self.disk_bytes < MIN_DISK_BYTES:
            raise InvalidSpec(f"SessionConfig.disk_bytes must be at least 1 MiB, got {self.disk_bytes}")

    def limits(self, output_bytes: int) -> ResourceLimits:
        """The limits of a session's own sandbox (its bwrap keeps ``output_bytes`` of what it says)."""
        return ResourceLimits(memory_bytes=self.memory_bytes, pids=self.pids, cpus=self.cpus, output_bytes=output_bytes)


def _last_pid() -> int:
    """The host's last pid handed out: every process a run starts after this has a larger one (until the
    counter wraps, which the marker sweep notices)."""
    try:
        with open("/proc/sys/kernel/ns_last_pid", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


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
        self._pending: dict[int, tuple[int, asyncio.Future[tuple[int, int]], SessionProgram | None]] = {}
        self._due: dict[int, float] = {}
        """When each pending request must be answered by (oldest first, as they were sent)."""
        self._watchdog: asyncio.TimerHandle | None = None
        self._abandoned: dict[int, SessionProgram | None] = {}
        """Requests whose caller was cancelled (and their program): their answer is expected, and dropped."""
        self._unclaimed: dict[int, SessionProgram | None] = {}
        """Programs started for an abandoned request (killed), by pid: their exit is expected, and dropped."""
        self._programs: dict[int, SessionProgram] = {}
        self._outputs: dict[int, SessionProgram] = {}
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
                self.supervisor_pid = _only_child(bwrap.pid)
                self.children = _open_children(self.supervisor_pid)
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
            self._fail(reason)
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

    def _fail(self, reason: str) -> None:
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
            _close_all(fds)
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
        program: SessionProgram,
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
        flags = (_FLAG_CTTY if ctty else 0) | (_FLAG_CAPTURE if program.captures else 0)
        flags |= _FLAG_RUN_DIR if run_dir is not None else 0
        body = _SPAWN.pack(flags, len(rlimits), len(argv), len(env))
        body += b"".join(_RLIMIT.pack(which, 0, soft, hard) for which, soft, hard in rlimits)
        body += os.fsencode("\0".join(strings) + "\0")
        if len(body) > self.max_request:
            _close_all(fds)
            raise InvalidSpec(
                f"the arguments and environment of a session run take {len(body)} bytes, more than "
                f"{self.max_request}; pass large data through stdin or a file, or use mode='per-run'"
            )
        pid, err = await self._request(_OP_SPAWN, _SPAWNED, body, fds, program)
        if pid == _NO_RUN_DIR:
            raise RunDirFailed(err, os.strerror(err), run_dir)
        if err:
            raise OSError(err, os.strerror(err), argv[0])
        return pid

    def signal(self, pid: int, sig: int, *, group: bool) -> None:
        """Ask for ``sig`` to ``pid`` (its process group with ``group``), without waiting for the answer."""
        if not self.usable:
            return
        task = self._loop.create_task(self._request(_OP_SIGNAL, _SIGNALED, _SIGNAL.pack(pid, sig, int(group)), []))
        self._tasks.add(task)
        task.add_done_callback(_forget(self._tasks))

    async def listener(self) -> socket.socket:
        """A TCP socket listening on ``127.0.0.1`` of the session's network namespace (a free port), for one run's
        egress proxy.

        Raises:
            OSError: the supervisor could not make it (its errno).
            BackendError: the session is over or broke.
        """
        fd, err = await self._request(_OP_LISTEN, _LISTENING, b"", [])
        if err:
            raise OSError(err, os.strerror(err), "listening on the session's loopback")
        return socket.socket(fileno=fd)

    async def _request(
        self, op: int, kind: int, body: bytes, fds: list[int], program: SessionProgram | None = None
    ) -> tuple[int, int]:
        if not self.usable:
            _close_all(fds)
            raise self.broken or BackendError(f"sandbox session of workspace {self.name!r} was ended")
        ident = next(self._ids) & 0xFFFF_FFFF
        fut: asyncio.Future[tuple[int, int]] = self._loop.create_future()
        self._pending[ident] = (kind, fut, program)
        self._due[ident] = due = self._loop.time() + self.config.request_timeout
        if self._watchdog is None:
            self._watchdog = self._loop.call_at(due, self._overdue)
        self._send(_HEAD.pack(op, ident) + body, fds)
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
            self._fail(f"did not answer within {self.config.request_timeout} s (stopped or hung)")
        else:
            self._watchdog = self._loop.call_at(due, self._overdue)

    def _disown(self, kind: int, pid: int, err: int) -> None:
        if kind == _LISTENING and err == 0:
            os.close(pid)  # the listener's fd: asked for by a caller who has gone
        if kind == _SPAWNED and err == 0 and (program := self._programs.pop(pid, None)) is not None:
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
                self._fail(f"channel failed ({exc.strerror})")
                return
            self._outbox.popleft()
            _close_all(fds)
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
                    _MSG.size + _OUT_CHUNK + 1, _ANCILLARY, socket.MSG_CMSG_CLOEXEC
                )
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._fail(f"channel failed ({exc.strerror})")
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
                _close_all(fds)
                self._fail("exited")
                return
            size = len(data)
            if flags & _CUT or size < _MSG.size:
                _close_all(fds)
                self._fail(f"sent a malformed message ({size} bytes, flags {flags:#x})")
                return
            kind, ident, a, b = _MSG.unpack_from(data)
            # only OUTPUT carries more than the head: at least one byte, at most _OUT_CHUNK
            if (size > _MSG.size) != (kind == _OUTPUT) or size > _MSG.size + _OUT_CHUNK:
                _close_all(fds)
                self._fail(f"sent a malformed message (kind {kind}, {size} bytes)")
                return
            problem = self._dispatch(kind, ident, a, b, data, fds)
            if problem is not None:
                _close_all(fds)
                self._fail(problem)
                return

    def _dispatch(self, kind: int, ident: int, a: int, b: int, data: bytes, fds: list[int]) -> str | None:
        """Act on one message (``data``: the whole of it; ``fds``: those it carried, taken over when it is fine);
        what is wrong with it, if anything."""
        if len(fds) != (kind == _LISTENING and b == 0):
            return f"sent {len(fds)} fds with message kind {kind}"
        if kind == _LISTENING:
            return self._listening(ident, a, b, fds)
        if not self._ready.done():
            if (kind, ident, a, b) != (_READY, 0, 0, 0):
                return f"sent message kind {kind} before it was ready"
            self._ready.set_result(None)
            return None
        if kind in (_OUTPUT, _CLOSED):
            program = self._outputs.get(ident)
            if program is None or b != 0 or not program.output_open(a):
                return f"sent output of a program it was not running, or after its end (id {ident}, fd {a})"
            if kind == _OUTPUT:
                program.output(a, data[_MSG.size :])
            else:
                self._output_ended(ident, program, a)
            return None
        if kind == _EXITED:
            return self._exited(ident, a, b)
        if kind in (_SPAWNED, _SIGNALED) and ident in self._abandoned:
            program = self._abandoned.pop(ident)
            if kind == _SPAWNED and b == 0 and a > 1 and a not in self._programs and a not in self._unclaimed:
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
        failed = 0 < b <= _MAX_ERRNO and (a == 0 or (a == _NO_RUN_DIR and program is not None and program.run_dir))
        if kind == _SPAWNED and not (failed or started):
            return f"answered a start with an impossible pid/errno ({a}, {b})"
        if kind == _SIGNALED and not (0 <= a <= _MAX_ERRNO and b == 0):
            return f"answered a signal with an impossible errno ({a}, {b})"
        if kind == _SPAWNED and b == 0 and program is not None:
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
            _close_all(fds)
            return None
        want, fut, _ = self._pending.get(ident, (0, None, None))
        if fut is None or want != _LISTENING or fut.done():
            return f"answered a request it was not asked (kind {_LISTENING}, id {ident})"
        fut.set_result((fds[0], 0) if fds else (-1, err))
        return None

    def _exited(self, flags: int, pid: int, status: int) -> str | None:
        unclaimed = pid in self._unclaimed
        program = self._unclaimed.pop(pid) if unclaimed else self._programs.pop(pid, None)
        if (program is None and not unclaimed) or not _valid_status(status):
            return f"reported the exit of a program it was not running (pid {pid}, status {status})"
        ended = [fd for fd, bit in _ENDED.items() if flags & bit]
        captures = program is not None and program.captures
        if flags & ~(_GROUP_LEFT | (sum(_ENDED.values()) if captures else 0)):
            return f"reported the exit of program {pid} with unknown flags {flags:#x}"
        if program is not None and any(not program.output_open(fd) for fd in ended):
            return f"reported the end of an output of program {pid} that had ended"
        for fd in ended:
            assert program is not None
            self._output_ended(program.output_id, program, fd)
        if program is not None and not unclaimed:
            # after its output's end: the exit of a run whose output ended finishes it at once
            program.reported_exit(status, group_left=bool(flags & _GROUP_LEFT))
        return None

    def _output_ended(self, ident: int, program: SessionProgram, fd: int) -> None:
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


def _only_child(pid: int | None) -> int | None:
    """bwrap's one child (with ``--as-pid-1``, the supervisor itself), by its host pid."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = f.read().split()
    except OSError:
        return None
    return int(children[0]) if len(children) == 1 else None


def kill_marked_children(supervisor: int, marker: str, children: int | None = None) -> int:
    """SIGKILL the processes of the session (the supervisor's descendants) whose environment carries ``marker``;
    return how many. Walking the session's tree in ``/proc`` instead of scanning every process of the host keeps
    a run's teardown cheap, and finds what left the run's process group (``setsid``) wherever it is.
    ``children``: :attr:`Session.children`, where it is open."""
    needle = f"{RUN_MARKER_VAR}={marker}\0".encode()
    killed = 0
    for _ in range(3):  # a dying parent may fork once more: look again until quiet
        found = 0
        for pid in _descendants(supervisor, children):
            try:
                marked = needle in _read_proc(f"/proc/{pid}/environ")
            except OSError:
                continue
            if marked:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    found += 1
        if not found:
            break
        killed += found
    return killed


def _descendants(supervisor: int, children_fd: int | None) -> list[int]:
    found: list[int] = []
    todo = [supervisor]
    while todo:
        parent = todo.pop()
        try:
            # the supervisor has one thread (supervisor.c): its children are its main task's, and in the usual
            # case, a run that left nothing behind, that one read is the whole walk
            tasks = [str(parent)] if parent == supervisor else os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                if parent == supervisor and children_fd is not None:
                    listed = _pread_all(children_fd)
                else:
                    listed = _read_proc(f"/proc/{parent}/task/{task}/children")
            except OSError:
                continue
            children = [int(c) for c in listed.split()]
            found += children
            todo += children
    return found


def _open_children(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        return os.open(f"/proc/{pid}/task/{pid}/children", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _pread_all(fd: int) -> bytes:
    """All of a ``/proc`` file kept open: read from its start again, as it is now."""
    chunks = [os.pread(fd, 65536, 0)]
    while len(chunks[-1]) == 65536:
        chunks.append(os.pread(fd, 65536, 65536 * len(chunks)))
    return b"".join(chunks)


def _read_proc(path: str) -> bytes:
    """The whole of a ``/proc`` file, in plain system calls: a run's teardown reads a few of them, every run."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _forget(tasks: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # a failed signal ended the session already; nothing more to say

    return done


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
        self._floor = _last_pid() if self._session.supervisor_pid is None else 0
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
            _close_all(child)
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
            self._session._fail(f"did not report the end of program {self.session_pid} after SIGKILL")
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
