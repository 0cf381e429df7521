"""The warm daemon behind ``execspace daemon start``: a fork server for the command line.

The daemon imports the command line, asyncio and the local and sandbox backends once, then
waits on a unix socket in a private directory. For each ``execspace`` invocation that
connects (same uid only, checked with SO_PEERCRED) it forks a worker that takes over the
caller's stdin/stdout/stderr, working directory, umask and environment, and runs
:func:`execspace.cli.main.main` on the caller's argv: the same code path, minus the start-up.

The daemon itself never runs commands, starts threads or opens an event loop, so that a
fork copies nothing half-done. It exits after ``idle_timeout`` seconds without requests,
on ``execspace daemon stop`` or SIGTERM, and as soon as the package's source files change
(the caller then runs the command itself: never old code behind a new install).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import io
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
from dataclasses import dataclass
from pathlib import Path

from .launcher import EXIT_EXECSPACE_ERROR, PROTOCOL

__all__ = ["ForkServer", "Request", "SourceStamp", "decode_request", "main"]

_MAX_REQUEST = 8 << 20
_REQUEST_TIMEOUT = 5.0
#: Modules every command needs, and those of the backends that start without extras. pyseccomp
#: matters most: importing it runs ctypes.util.find_library (about 80 ms here).
PRELOAD = (
    "execspace.cli.main",
    "execspace.backends.local",
    "execspace.backends.sandbox",
    "execspace.backends.sandbox.seccomp",
    "execspace.workspace.staging",
    "concurrent.futures.thread",
    "pyseccomp",
)


@dataclass(frozen=True, slots=True)
class Request:
    kind: bytes
    cwd: bytes
    umask: int
    argv: list[str]
    env: dict[bytes, bytes]


def decode_request(payload: bytes) -> Request:
    """Parse what :func:`execspace.cli.launcher.encode_request` built (raises ValueError)."""
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
        self._children: set[int] = set()
        self._served = 0
        self._started = time.monotonic()
        self._last_activity = self._started
        self._stop = False

    def serve(self) -> None:
        listener = self._listen()
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_stop", True))
        inode = os.stat(self.path).st_ino
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(listener, selectors.EVENT_READ)
                while not self._stop and not self._idle():
                    if selector.select(timeout=0.5):
                        self._accept(listener)
                    self._reap()
        finally:
            listener.close()
            with contextlib.suppress(OSError):
                if os.stat(self.path).st_ino == inode:  # never remove a successor's socket
                    os.unlink(self.path)

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
        return not self._children and time.monotonic() - self._last_activity > self.idle_timeout

    def _reap(self) -> None:
        for pid in list(self._children):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    self._children.discard(pid)

    def _accept(self, listener: socket.socket) -> None:
        conn, _ = listener.accept()
        self._last_activity = time.monotonic()
        fds: list[int] = []
        try:
            if not _same_user(conn):
                return
            conn.settimeout(_REQUEST_TIMEOUT)
            request, fds = _receive(conn)
            if request.kind == b"ping":
                uptime = time.monotonic() - self._started
                conn.sendall(b"pong pid=%d served=%d uptime=%d" % (os.getpid(), self._served, uptime))
            elif request.kind == b"stop":
                self._stop = True
                conn.sendall(b"stopping")
            elif self._stamp.changed():
                self._stop = True
                conn.sendall(b"stale")
            elif request.kind == b"run" and len(fds) == 3:
                self._fork(listener, conn, request, fds)
        except (OSError, ValueError) as exc:
            print(f"execspace daemon: dropped a request: {exc}", file=sys.stderr, flush=True)
        finally:
            for fd in fds:
                os.close(fd)
            conn.close()

    def _fork(self, listener: socket.socket, conn: socket.socket, request: Request, fds: list[int]) -> None:
        pid = os.fork()
        if pid == 0:
            listener.close()
            _worker(conn, request, fds, self._parser)  # never returns
        self._children.add(pid)
        self._served += 1


def _same_user(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return bool(uid == os.getuid())


def _receive(conn: socket.socket) -> tuple[Request, list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 3)
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        if len(data) > _MAX_REQUEST:
            raise ValueError("request too large")
        chunk = conn.recv(65536)
        if not chunk:
            raise ValueError("connection closed mid-request")
        data += chunk
    size = int.from_bytes(data[:4], "big")
    return decode_request(data[4 : 4 + size]), fds


def _worker(conn: socket.socket, request: Request, fds: list[int], parser: argparse.ArgumentParser) -> None:
    """Become the caller's command: its stdio, directory, umask and environment; report the exit status."""
    status = EXIT_EXECSPACE_ERROR
    try:
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
        with contextlib.suppress(ImportError, RuntimeError):  # pyseccomp raises RuntimeError without libseccomp
            importlib.import_module(module)
    watched = args.watch or Path(importlib.import_module("execspace").__file__ or ".").parent
    ForkServer(args.socket, args.idle_timeout, SourceStamp(watched)).serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
