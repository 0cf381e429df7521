"""The warm daemon behind ``execspace daemon start``: a fork server for the command line.

The daemon imports the command line, asyncio and the local and sandbox backends once, then
waits on a unix socket in a private directory. For each ``execspace`` invocation that
connects (same uid, checked with SO_PEERCRED, and holding the daemon's key, which only
processes outside every sandbox can read) it forks a worker that takes over the caller's
stdin/stdout/stderr, working directory, umask and environment, and runs
:func:`execspace.cli.main.main` on the caller's argv: the same code path, minus the start-up.
Requests are read without blocking, several at once: a client that connects and sends
nothing delays nobody, and is dropped after ``_HANDSHAKE_TIMEOUT``.

The daemon itself never runs commands, starts threads or opens an event loop, so that a
fork copies nothing half-done. It exits after ``idle_timeout`` seconds without requests,
on ``execspace daemon stop`` or SIGTERM, and as soon as the package's source files change
(the caller then runs the command itself: never old code behind a new install).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import hmac
import io
import math
import os
import selectors
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .daemonwire import EXIT_EXECSPACE_ERROR, KEY_BYTES, PROTOCOL, daemon_key_path, private_dir_ok

__all__ = ["ForkServer", "Request", "SourceStamp", "decode_request", "main"]

_MAX_REQUEST = 8 << 20
#: A real launcher sends its whole request right after connecting: this only bounds a stuck client.
_HANDSHAKE_TIMEOUT = 5.0
#: Requests being read at once; beyond it the oldest is dropped (each holds a socket and up to 3 fds).
_MAX_PENDING = 32
_REPLY_TIMEOUT = 5.0
#: Modules every command needs, and those of the backends that start without extras.
PRELOAD = (
    "execspace.cli.main",
    "execspace.backends.local",
    "execspace.backends.sandbox",
    "execspace.backends.sandbox.seccomp",
    "concurrent.futures.thread",
)


@dataclass(frozen=True, slots=True)
class Request:
    kind: bytes
    cwd: bytes
    umask: int
    argv: list[str]
    env: dict[bytes, bytes]


@dataclass(slots=True)
class _Pending:
    """A connection whose request is still arriving."""

    conn: socket.socket
    deadline: float
    data: bytearray = field(default_factory=bytearray)
    fds: list[int] = field(default_factory=list)

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()
        self.conn.close()


def decode_request(payload: bytes) -> Request:
    """Parse what :func:`execspace.cli.daemonwire.encode_request` built (raises ValueError)."""
    fields = payload.split(b"\0")
    if len(fields) < 5 or fields[0] != PROTOCOL:
        raise ValueError("not an execspace-cli/1 request")
    count = int(fields[4])
    argv = [os.fsdecode(arg) for arg in fields[5 : 5 + count]]
    if len(argv) != count:
        raise ValueError("truncated argv")
    env: dict[bytes, bytes] = {}
    for entry in fields[5 + count :]:
        key, sep, value = entry.partition(b"=")
        if not sep or not key:
            raise ValueError("malformed environment entry")
        env[key] = value
    return Request(fields[1], fields[2], int(fields[3], 8), argv, env)


class SourceStamp:
    """The newest modification time among a package's ``.py`` files, to notice an upgrade or an edit."""

    def __init__(self, package_dir: Path) -> None:
        self._dir = package_dir
        self._stamp = self._read()

    def _read(self) -> tuple[int, int]:
        files = list(self._dir.rglob("*.py"))
        return len(files), max((f.stat().st_mtime_ns for f in files), default=0)

    def changed(self) -> bool:
        try:
            return self._read() != self._stamp
        except OSError:  # a file vanished mid-walk: an install is under way
            return True


class ForkServer:
    """Accepts requests on ``path`` and forks one worker per command."""

    def __init__(self, path: str, idle_timeout: float, stamp: SourceStamp) -> None:
        from .main import build_parser

        self._parser = build_parser()  # argparse and its translations cost ~10 ms per command otherwise
        self.path = path
        self.idle_timeout = idle_timeout
        self._stamp = stamp
        self._key = b""
        self._children: set[int] = set()
        self._pending: dict[int, _Pending] = {}
        self._served = 0
        self._started = time.monotonic()
        self._last_activity = self._started
        self._stop = False

    def serve(self) -> None:
        if not private_dir_ok(os.path.dirname(self.path)):
            raise SystemExit(f"execspace daemon: {os.path.dirname(self.path)} is not a private directory of ours")
        key_inode = self._write_key()
        listener = self._listen()
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_stop", True))
        inode = os.stat(self.path).st_ino
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(listener, selectors.EVENT_READ)
                while not self._stop and not self._idle():
                    for key, _ in selector.select(timeout=self._wait()):
                        if key.fileobj is listener:
                            self._accept(listener, selector)
                        else:
                            self._advance(self._pending[key.fd], listener, selector)
                    self._expire(selector)
                    self._reap()
        finally:
            listener.close()
            for pending in self._pending.values():
                pending.close()
            for path, ours in ((self.path, inode), (daemon_key_path(self.path), key_inode)):
                with contextlib.suppress(OSError):
                    if os.stat(path).st_ino == ours:  # never remove a successor's socket or key
                        os.unlink(path)

    def _write_key(self) -> int:
        """A fresh random key in a 0600 file; written whole before it takes the final name."""
        self._key = os.urandom(KEY_BYTES)
        final = daemon_key_path(self.path)
        temp = f"{final}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, self._key)
            inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        os.replace(temp, final)
        return inode

    def _listen(self) -> socket.socket:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a dead daemon's socket; the caller checked none answers
        old = os.umask(0o077)
        try:
            listener.bind(self.path)
        finally:
            os.umask(old)
        listener.listen(64)
        return listener

    def _idle(self) -> bool:
        idle = not self._children and not self._pending
        return idle and time.monotonic() - self._last_activity > self.idle_timeout

    def _wait(self) -> float:
        """How long select may sleep: until the next handshake deadline, at most 0.5 s."""
        soonest = min((p.deadline for p in self._pending.values()), default=math.inf)
        return max(0.0, min(0.5, soonest - time.monotonic()))

    def _reap(self) -> None:
        for pid in list(self._children):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    self._children.discard(pid)

    def _accept(self, listener: socket.socket, selector: selectors.BaseSelector) -> None:
        try:
            conn, _ = listener.accept()
        except OSError:  # gone before we got to it, or out of descriptors for now
            return
        self._last_activity = time.monotonic()
        if not _same_user(conn):
            conn.close()
            return
        conn.setblocking(False)
        if len(self._pending) >= _MAX_PENDING:
            oldest = min(self._pending.values(), key=lambda p: p.deadline)
            self._drop(oldest, selector, "too many requests arriving at once")
        self._pending[conn.fileno()] = _Pending(conn, self._last_activity + _HANDSHAKE_TIMEOUT)
        selector.register(conn, selectors.EVENT_READ)

    def _drop(self, pending: _Pending, selector: selectors.BaseSelector, why: str | None) -> None:
        selector.unregister(pending.conn)
        del self._pending[pending.conn.fileno()]
        pending.close()
        if why is not None:
            print(f"execspace daemon: dropped a request: {why}", file=sys.stderr, flush=True)

    def _expire(self, selector: selectors.BaseSelector) -> None:
        now = time.monotonic()
        for pending in [p for p in self._pending.values() if p.deadline <= now]:
            self._drop(pending, selector, f"nothing complete within {_HANDSHAKE_TIMEOUT:g} s")

    def _advance(self, pending: _Pending, listener: socket.socket, selector: selectors.BaseSelector) -> None:
        """Read what arrived; once the request is whole (and only if it began with our key), serve it."""
        try:
            complete = _read_more(pending, self._key)
        except BlockingIOError:
            return
        except (OSError, ValueError) as exc:
            self._drop(pending, selector, str(exc))
            return
        if complete is None:
            return
        selector.unregister(pending.conn)
        del self._pending[pending.conn.fileno()]
        try:
            pending.conn.setblocking(True)
            pending.conn.settimeout(_REPLY_TIMEOUT)
            self._serve(pending, decode_request(complete), listener, selector)
        except (OSError, ValueError) as exc:
            print(f"execspace daemon: dropped a request: {exc}", file=sys.stderr, flush=True)
        finally:
            pending.close()

    def _serve(
        self, pending: _Pending, request: Request, listener: socket.socket, selector: selectors.BaseSelector
    ) -> None:
        conn = pending.conn
        if request.kind == b"ping":
            uptime = time.monotonic() - self._started
            conn.sendall(b"pong pid=%d served=%d uptime=%d" % (os.getpid(), self._served, uptime))
        elif request.kind == b"stop":
            self._stop = True
            conn.sendall(b"stopping")
        elif self._stamp.changed():
            self._stop = True
            conn.sendall(b"stale")
        elif request.kind == b"run" and len(pending.fds) == 3:
            self._fork(pending, request, listener, selector)

    def _fork(
        self, pending: _Pending, request: Request, listener: socket.socket, selector: selectors.BaseSelector
    ) -> None:
        pid = os.fork()
        if pid == 0:
            # nothing of the daemon's stays open in the worker: the listener, the selector, other requests
            listener.close()
            selector.close()
            for other in self._pending.values():
                other.close()
            fds, pending.fds = pending.fds, []
            _worker(pending.conn, request, fds, self._parser)  # never returns
        self._children.add(pid)
        self._served += 1


def _read_more(pending: _Pending, key: bytes) -> bytes | None:
    """Read one chunk; the request's payload once it is whole, else None.

    Raises:
        BlockingIOError: nothing to read yet.
        ValueError: not one of our launchers (wrong key), or a malformed or oversized request.
        OSError: the connection failed.
    """
    data, fds, flags, _addr = socket.recv_fds(pending.conn, 65536, 3)
    pending.fds += fds
    if flags & socket.MSG_CTRUNC or len(pending.fds) > 3:
        raise ValueError("more descriptors than stdin, stdout and stderr")
    if not data:
        raise ValueError("connection closed mid-request")
    pending.data += data
    head = KEY_BYTES + 4
    if len(pending.data) >= KEY_BYTES and not hmac.compare_digest(bytes(pending.data[:KEY_BYTES]), key):
        raise ValueError("a client without the daemon's key (refused)")
    if len(pending.data) < head:
        return None
    size = int.from_bytes(pending.data[KEY_BYTES:head], "big")
    if size > _MAX_REQUEST:
        raise ValueError("request too large")
    if len(pending.data) < head + size:
        return None
    return bytes(pending.data[head : head + size])


def _same_user(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return bool(uid == os.getuid())


def _worker(conn: socket.socket, request: Request, fds: list[int], parser: argparse.ArgumentParser) -> None:
    """Become the caller's command: its stdio, directory, umask and environment; report the exit status."""
    status = EXIT_EXECSPACE_ERROR
    try:
        conn.settimeout(None)  # the signal relay waits on it as long as the command runs
        conn.sendall(b"+")  # the command has begun: from here the caller must never run it again
        os.setsid()
        signal.signal(signal.SIGTERM, _exit_on_term)  # until the command's own handler takes over
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        _adopt_stdio()
        os.chdir(request.cwd)
        os.umask(request.umask)
        os.environ.clear()
        os.environb.update(request.env)
        tempfile.tempdir = None  # recomputed from the caller's TMPDIR
        threading.Thread(target=_relay_signals, args=(conn,), daemon=True).start()
        status = _run(request.argv, parser)
    except BaseException:
        traceback.print_exc()
    finally:
        # os._exit skips atexit, where a backend keeps its last-resort cleanup (a container's removal):
        # run it as an interpreter exit would, but never unwind into the daemon's own stack
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(OSError):
            conn.sendall(b"exit %d" % status)
        os._exit(0)


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _adopt_stdio() -> None:
    """New std streams on the caller's descriptors: buffering follows whether each is a terminal."""
    # the streams live as long as the worker: nothing to close them with
    stdin = open(0, "rb", closefd=False)  # noqa: SIM115
    stdout = open(1, "wb", closefd=False)  # noqa: SIM115
    stderr = open(2, "wb", closefd=False)  # noqa: SIM115
    sys.stdin = io.TextIOWrapper(stdin, encoding="utf-8", errors="surrogateescape")
    sys.stdout = io.TextIOWrapper(stdout, encoding="utf-8", errors="surrogateescape", line_buffering=os.isatty(1))
    sys.stderr = io.TextIOWrapper(stderr, encoding="utf-8", errors="backslashreplace", line_buffering=True)


def _relay_signals(conn: socket.socket) -> None:
    """Deliver the signals the caller forwards; if the caller goes away, stop as on SIGTERM."""
    while True:
        try:
            message = conn.recv(2)
        except OSError:
            message = b""
        if len(message) == 2 and message[:1] == b"S":
            os.kill(os.getpid(), message[1])
        elif not message:
            os.kill(os.getpid(), signal.SIGTERM)
            return


def _run(argv: list[str], parser: argparse.ArgumentParser) -> int:
    from .main import main as run_command

    try:
        return run_command(argv, parser)
    except SystemExit as exc:  # argparse's --help and usage errors
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m execspace.cli.forkserver")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--idle-timeout", type=float, default=900.0)
    parser.add_argument("--watch", type=Path, help="exit when .py files below this change (default: the package)")
    args = parser.parse_args(argv)
    import importlib

    for module in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    watched = args.watch or Path(importlib.import_module("execspace").__file__ or ".").parent
    ForkServer(args.socket, args.idle_timeout, SourceStamp(watched)).serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
