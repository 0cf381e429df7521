"""The sandbox's C helpers, built on first use with the system C compiler: the session supervisor
(``supervisor.c``), the egress bridge of allow-list runs (``egressbridge.c``), machine mode's helper
(``machine.c``) and the grant helper of a root caller's host grants (``grants.c``): the host's root runs the last
two, which are never copied into a sandbox.

Cached per user in a private (0700) directory, named by the sha256 of the source and of the compiler's identity,
written under a temporary name and renamed into place; a cached file is used only when it is a regular file of
ours that nobody else can write, in a directory nobody else can write.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from ...errors import SetupFailed

__all__ = [
    "EGRESS_FIX",
    "GRANTS_FIX",
    "MACHINE_FIX",
    "SESSION_FIX",
    "SOURCE",
    "egress_bridge_binary",
    "grants_binary",
    "machine_binary",
    "supervisor_binary",
]

SOURCE = Path(__file__).with_name("supervisor.c")
BRIDGE_SOURCE = Path(__file__).with_name("egressbridge.c")
MACHINE_SOURCE = Path(__file__).with_name("machine.c")
GRANTS_SOURCE = Path(__file__).with_name("grants.c")
#: The headers they include (found beside them): part of what a build's key covers.
HEADERS = tuple(Path(__file__).with_name(h) for h in ("fdpass.h", "supervisorprotocol.h", "roothelper.h"))
#: How to get session mode working where it cannot build its supervisor.
SESSION_FIX = 'install a C compiler (apt-get install gcc), or use mode="per-run"'
#: How to get allow-list runs working where the bridge cannot be built.
EGRESS_FIX = "install a C compiler (apt-get install gcc), or run with network='off' or 'on'"
#: How to get machine mode working where its helper cannot be built.
MACHINE_FIX = "install a C compiler (apt-get install gcc), or open the engine without machine=True"
#: How to get a root caller's host grants working where the grant helper cannot be built.
GRANTS_FIX = (
    "install a C compiler (apt-get install gcc), or run execspace as the owner of the granted tree (a normal user)"
)


def supervisor_binary(cache_root: Path) -> Path:
    """The built supervisor in ``cache_root/bin`` (built now if missing). Blocking: call it in a thread.

    Raises:
        SetupFailed: no C compiler, the build failed, or the cache directory is not private to this user.
    """
    return _helper(cache_root, SOURCE, "supervisor", "session mode builds its supervisor", SESSION_FIX)


def egress_bridge_binary(cache_root: Path) -> Path:
    """The built egress bridge in ``cache_root/bin``, as :func:`supervisor_binary` (blocking, same errors)."""
    return _helper(cache_root, BRIDGE_SOURCE, "egress-bridge", "a network allow-list builds its bridge", EGRESS_FIX)


def machine_binary(cache_root: Path) -> Path:
    """The built machine helper in ``cache_root/bin``, as :func:`supervisor_binary` (blocking, same errors)."""
    return _helper(cache_root, MACHINE_SOURCE, "machine", "machine mode builds its helper", MACHINE_FIX)


def grants_binary(cache_root: Path) -> Path:
    """The built grant helper in ``cache_root/bin``, as :func:`supervisor_binary` (blocking, same errors)."""
    return _helper(cache_root, GRANTS_SOURCE, "grants", "a host grant as root builds its helper", GRANTS_FIX)


def _helper(cache_root: Path, source_path: Path, name: str, why: str, fix: str) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SetupFailed("sandbox", f"{why} with a C compiler, and none is on PATH", fix)
    source = source_path.read_bytes() + b"".join(h.read_bytes() for h in HEADERS)
    try:
        ident = subprocess.run([cc, "--version"], capture_output=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise SetupFailed("sandbox", f"the C compiler {cc} does not run: {exc}", fix) from exc
    key = hashlib.sha256(source + b"\0" + os.path.realpath(cc).encode() + b"\0" + ident).hexdigest()[:32]
    directory = _private_dir(cache_root / "bin")
    target = directory / f"{name}-{key}"
    if _trusted_file(target):
        return target
    _build(cc, source_path, directory, target, fix)
    if not _trusted_file(target):
        raise SetupFailed("sandbox", f"the {name} built at {target} is not a private file of this user", fix)
    return target


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise SetupFailed(
            "sandbox",
            f"{path} must be a directory of uid {os.geteuid()} with mode 0700 (it holds the sandbox's helper binaries)",
            f"remove {path}; it is made again on the next use",
        )
    return path


def _trusted_file(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _build(cc: str, source: Path, directory: Path, target: Path, fix: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".build-", dir=directory)
    os.close(fd)
    try:
        # dynamic: each session gets its own copy of the binary (bwrap --ro-bind-data), so small beats static;
        # the libc it maps is the page cache's, shared with every other process
        done = subprocess.run([cc, "-O2", "-o", tmp, str(source)], capture_output=True, timeout=120, check=False)
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise SetupFailed("sandbox", f"building {source.name} with {cc} failed: {err[0]}", fix)
        os.chmod(tmp, 0o755)  # noqa: S103 - the sandbox's uid executes it; nobody can write it
        os.rename(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
