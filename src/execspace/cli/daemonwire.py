"""What the launcher and the daemon share: where a daemon listens, its key, and how a request is encoded.

The launcher imports this on its fast path, so only ``os``, ``stat``, ``sys`` and ``zlib`` are imported here (see
:mod:`.launcher`); the daemon (:mod:`.daemon`, :mod:`.forkserver`) imports it without importing the launcher, whose
fallback runs the whole CLI.
"""

from __future__ import annotations

import os
import stat
import sys
import zlib

from ..rundirs import daemon_dirs

TYPE_CHECKING = False  # typing and collections.abc cost more than the launcher's whole job
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "EXIT_EXECSPACE_ERROR",
    "KEY_BYTES",
    "PROTOCOL",
    "daemon_key_path",
    "daemon_socket_path",
    "encode_request",
    "private_dir_ok",
    "read_key",
]

PROTOCOL = b"execspace-cli/2"
#: Length of the daemon's key, which every request starts with.
KEY_BYTES = 32
EXIT_EXECSPACE_ERROR = 125


def daemon_socket_path(environ: os._Environ[str] | dict[str, str] | None = None) -> str:
    """Where the daemon for this interpreter and this copy of execspace listens.

    The name depends on the interpreter prefix and the package's location, so another
    virtualenv or checkout never talks to a daemon running different code.
    """
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    key = zlib.crc32(f"{sys.prefix}\0{package}".encode(errors="surrogateescape"))
    return f"{daemon_dirs(environ)[0]}/cli-{key:08x}.sock"


def daemon_key_path(socket_path: str) -> str:
    """Where the daemon listening at ``socket_path`` keeps its key."""
    return socket_path.removesuffix(".sock") + ".key"


def read_key(socket_path: str) -> bytes | None:
    """The key of the daemon at ``socket_path``; None unless a private regular file of ours holds it."""
    try:
        fd = os.open(daemon_key_path(socket_path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        private = stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077 == 0
        key = os.read(fd, KEY_BYTES + 1) if private else b""
    except OSError:
        key = b""
    finally:
        os.close(fd)
    return key if len(key) == KEY_BYTES else None


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
    """One request (sent after the key): NUL-separated fields, argv counted, environment entries last."""
    fields = [PROTOCOL, kind, cwd, b"%o" % umask, b"%d" % len(argv)]
    fields += [os.fsencode(arg) for arg in argv]
    fields += [k + b"=" + v for k, v in env.items()]
    payload = b"\0".join(fields)
    return len(payload).to_bytes(4, "big") + payload
