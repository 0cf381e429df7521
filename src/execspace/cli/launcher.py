"""The ``execspace`` entry point: hand the command to a warm daemon if one runs, else run it here.

Starting Python and importing asyncio and the library costs far more than a sandboxed run
(about 150 ms against 20 ms here), so ``execspace daemon start`` keeps a process with
everything imported; this module, which imports almost nothing, passes it our argv,
environment, working directory, umask and the descriptors of our stdin/stdout/stderr
(SCM_RIGHTS). The daemon forks a worker that becomes "us" and runs the command exactly as
:func:`execspace.cli.main.main` would here; the program's output goes straight to our
terminal or pipe. Signals we receive are forwarded to the worker; if we die, the worker
sees the connection close and stops the program as it would on SIGTERM.

Only the standard C modules are imported on this path (``_socket``, ``_signal``, ``zlib``):
``socket``, ``signal`` and ``json`` pull in enum and re, which cost more than the run.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub; the public module imports enum
import _socket
import os
import stat
import sys
import zlib

TYPE_CHECKING = False  # typing and collections.abc cost more than this module's whole job
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["DISABLE_VAR", "daemon_socket_path", "encode_request", "forward", "main", "private_dir_ok"]

#: ``EXECSPACE_DAEMON=off`` (or 0/no/false) runs every command in this process.
DISABLE_VAR = "EXECSPACE_DAEMON"
PROTOCOL = b"execspace-cli/1"
#: The longest ``sun_path`` Linux accepts, NUL excluded.
_SUN_PATH_MAX = 107
_FORWARDED_SIGNALS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT)
EXIT_EXECSPACE_ERROR = 125


def daemon_socket_path(environ: os._Environ[str] | dict[str, str] | None = None) -> str:
    """Where the daemon for this interpreter and this copy of execspace listens.

    The name depends on the interpreter prefix and the package's location, so another
    virtualenv or checkout never talks to a daemon running different code.
    """
    env = os.environ if environ is None else environ
    base = env.get("XDG_RUNTIME_DIR") or "/tmp"
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    key = zlib.crc32(f"{sys.prefix}\0{package}".encode(errors="surrogateescape"))
    return f"{base}/execspace-daemon-{os.getuid()}/cli-{key:08x}.sock"


def private_dir_ok(path: str) -> bool:
    """True if ``path`` is a real directory of ours that nobody else can enter.

    A shared ``/tmp`` lets anyone create our directory's name first; then we must not
    talk to (or become) whatever listens there.
    """
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077 == 0


def encode_request(kind: bytes, argv: Sequence[str], env: dict[bytes, bytes], cwd: bytes, umask: int) -> bytes:
    """One request: NUL-separated fields, argv counted, environment entries last."""
    fields = [PROTOCOL, kind, cwd, b"%o" % umask, b"%d" % len(argv)]
    fields += [os.fsencode(arg) for arg in argv]
    fields += [k + b"=" + v for k, v in env.items()]
    payload = b"\0".join(fields)
    return len(payload).to_bytes(4, "big") + payload


def _connect(path: str) -> _socket.socket | None:
    if len(path.encode()) > _SUN_PATH_MAX or not private_dir_ok(os.path.dirname(path)):
        return None
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


def _stdio_open() -> bool:
    try:
        for fd in (0, 1, 2):
            os.fstat(fd)
    except OSError:
        return False
    return True


def forward(argv: Sequence[str]) -> int | None:
    """Run ``argv`` in the warm daemon and return its exit status; None if there is none to use."""
    if os.environ.get(DISABLE_VAR, "").lower() in ("0", "off", "no", "false"):
        return None
    if not argv or argv[0] == "daemon" or not _stdio_open():
        return None
    try:
        cwd = os.getcwdb()
    except OSError:  # our directory was removed: let the in-process path report it
        return None
    sock = _connect(daemon_socket_path())
    if sock is None:
        return None
    try:
        umask = os.umask(0o077)
        os.umask(umask)
        request = encode_request(b"run", argv, dict(os.environb), cwd, umask)
        fds = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in (0, 1, 2))
        try:
            sent = sock.sendmsg([request], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
            if sent < len(request):
                sock.sendall(request[sent:])
        except OSError:
            return None
        return _await_exit(sock)
    finally:
        sock.close()


def _await_exit(sock: _socket.socket) -> int | None:
    def relay(signum: int, frame: object) -> None:
        try:  # noqa: SIM105 - contextlib is one more import on the fast path
            sock.send(b"S" + bytes([signum]))
        except OSError:
            pass

    previous = {signum: _signal.signal(signum, relay) for signum in _FORWARDED_SIGNALS}
    reply = b""
    try:
        while chunk := sock.recv(64):
            reply += chunk
    except OSError:  # reset: the daemon went away; whether the command began is said by the "+" below
        pass
    if not reply.startswith(b"+"):
        for signum, handler in previous.items():
            _signal.signal(signum, handler)
        # No worker took the command (the daemon was stopping, or runs older code than this
        # copy): it never began, so running it here cannot run it twice.
        return None
    if reply.startswith(b"+exit "):
        return int(reply[6:])
    os.write(
        2,
        b"execspace: error: the execspace daemon's worker died before reporting an exit status; "
        b"rerun with EXECSPACE_DAEMON=off, and see `execspace daemon status`\n",
    )
    return EXIT_EXECSPACE_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point."""
    args = list(sys.argv[1:] if argv is None else argv)
    status = forward(args)
    if status is not None:
        return status
    from .main import main as run_here

    return run_here(args)


if __name__ == "__main__":
    raise SystemExit(main())
