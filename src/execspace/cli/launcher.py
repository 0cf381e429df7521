"""The ``execspace`` entry point: hand the command to a warm daemon if one runs, else run it here.

Starting Python and importing asyncio and the library costs far more than a sandboxed run
(about 150 ms against 20 ms here), so ``execspace daemon start`` keeps a process with
everything imported; this module, which imports almost nothing, passes it our argv,
environment, working directory, umask and the descriptors of our stdin/stdout/stderr
(SCM_RIGHTS). The daemon forks a worker that becomes "us" and runs the command exactly as
:func:`execspace.cli.main.main` would here; the program's output goes straight to our
terminal or pipe. Signals we receive are forwarded to the worker; if we die, the worker
sees the connection close and stops the program as it would on SIGTERM.

The uid (SO_PEERCRED) alone does not prove a caller: a sandboxed program runs as our uid
too when we are not root, and with the network on it may open unix sockets. So each daemon
writes a random key to a 0600 file next to its socket (a directory no sandbox is shown, see
:func:`execspace.rundirs.daemon_dirs`), and every request starts with that key.

Only the standard C modules are imported on this path (``_socket``, ``_signal``, ``zlib``):
``socket``, ``signal`` and ``json`` pull in enum and re, which cost more than the run.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub; the public module imports enum
import _socket
import os
import sys

from .daemonwire import EXIT_EXECSPACE_ERROR, daemon_socket_path, encode_request, private_dir_ok, read_key

TYPE_CHECKING = False  # typing and collections.abc cost more than this module's whole job
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["DISABLE_VAR", "forward", "main"]

#: ``EXECSPACE_DAEMON=off`` (or 0/no/false) runs every command in this process.
DISABLE_VAR = "EXECSPACE_DAEMON"
#: The longest ``sun_path`` Linux accepts, NUL excluded.
_SUN_PATH_MAX = 107
_FORWARDED_SIGNALS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT)


def _connect(path: str) -> tuple[_socket.socket, bytes] | None:
    if len(path.encode()) > _SUN_PATH_MAX or not private_dir_ok(os.path.dirname(path)):
        return None
    key = read_key(path)
    if key is None:
        return None
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock, key


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
    connected = _connect(daemon_socket_path())
    if connected is None:
        return None
    sock, key = connected
    try:
        umask = os.umask(0o077)
        os.umask(umask)
        request = key + encode_request(b"run", argv, dict(os.environb), cwd, umask)
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
