"""File metadata: string pairs kept with a workspace file as extended attributes in the ``user.e2b.`` namespace,
as E2B's envd keeps them, so that a program in the workspace sees them (``getfattr``) and may set them too.

The rules are envd's: a key is non-empty printable US-ASCII of at most 246 bytes (the kernel's 255 for a whole
attribute name, less the namespace), a value printable US-ASCII, and a file's whole set at most 4096 bytes (each
name with its namespace plus its value: what one ext4 block holds). Only regular files and directories hold them
(the kernel keeps no ``user.`` attribute on anything else), and a file only while it has one link: another name of
it may be a host file's (a planted hard link), so a file with more reads as holding none and is never written. An
attribute whose name or value is not UTF-8 (set by a program) is left out of what is read, as envd leaves it out.

Every access is through an ``O_PATH`` descriptor of the entry opened without following a link, and the attribute
calls name that descriptor's ``/proc/self/fd`` entry, which is the inode opened and nothing a path could be swapped
for. Where the platform has no such calls (macOS) or the filesystem keeps no user attributes (ENOTSUP), a file
holds no metadata: reads give none and writes report that nothing was kept.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping

from ..errors import UsageError

__all__ = [
    "MAX_KEY_BYTES",
    "MAX_TOTAL_BYTES",
    "PREFIX",
    "SUPPORTED",
    "check_file_metadata",
    "copy_between",
    "read_at",
    "write_at",
]

PREFIX = "user.e2b."
MAX_KEY_BYTES = 255 - len(PREFIX)
MAX_TOTAL_BYTES = 4096
#: Whether this platform has the calls (Linux); elsewhere no file holds metadata.
SUPPORTED = hasattr(os, "O_PATH") and hasattr(os, "listxattr")
_UNSUPPORTED = (errno.ENOTSUP, errno.EOPNOTSUPP)


def check_file_metadata(metadata: Mapping[str, str]) -> None:
    """``UsageError`` naming the first key or value envd's rules refuse (see the module), else nothing."""
    total = 0
    for key, value in metadata.items():
        if not key:
            raise UsageError("a metadata key is empty: name each key")
        if len(key) > MAX_KEY_BYTES:
            raise UsageError(f"metadata key {key[:40]!r}… is longer than {MAX_KEY_BYTES} bytes: shorten it")
        for what, text in (("key", key), (f"value of key {key!r}", value)):
            bad = next((c for c in text if not " " <= c <= "~"), None)
            if bad is not None:
                raise UsageError(f"metadata {what} holds {bad!r}: keys and values are printable US-ASCII only")
        total += len(PREFIX) + len(key) + len(value)
    if total > MAX_TOTAL_BYTES:
        raise UsageError(
            f"the metadata takes {total} bytes (each key with its 'user.e2b.' prefix, and its value), more than the "
            f"{MAX_TOTAL_BYTES} a file keeps: send fewer or shorter pairs"
        )


def read_at(dfd: int, name: str) -> dict[str, str]:
    """The metadata of the entry ``name`` in the directory ``dfd`` (a link's own: none); ``FileNotFoundError``
    if nothing is there."""
    if not SUPPORTED:
        return {}
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    try:
        if not _holds_metadata(os.fstat(fd)):
            return {}
        proc = f"/proc/self/fd/{fd}"
        found: dict[str, str] = {}
        for attr in _listed(proc):
            value = _value(proc, attr)
            if value is not None:
                found[attr[len(PREFIX) :]] = value
        return found
    finally:
        os.close(fd)


def write_at(fd: int, metadata: Mapping[str, str]) -> bool:
    """Make ``metadata`` the whole set of the entry opened as ``fd`` (``O_PATH``): keys it lacks are removed.
    False where the entry or its filesystem keeps none (nothing written)."""
    if not SUPPORTED or not _holds_metadata(os.fstat(fd)):
        return False
    proc = f"/proc/self/fd/{fd}"
    try:
        for attr in os.listxattr(proc):
            if attr.startswith(PREFIX) and attr[len(PREFIX) :] not in metadata:
                try:
                    os.removexattr(proc, attr)
                except OSError as exc:
                    if exc.errno != errno.ENODATA:  # removed meanwhile
                        raise
        for key, value in metadata.items():
            os.setxattr(proc, PREFIX + key, value.encode())
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return False
        raise
    return True


def copy_between(src: int, dst: int) -> None:
    """Give the file open as ``dst`` the metadata of the one open as ``src`` (both real descriptors, not
    ``O_PATH``): what a copy of a tree keeps. Nothing where either filesystem keeps none."""
    if not SUPPORTED:
        return
    try:
        for attr in os.listxattr(src):
            if attr.startswith(PREFIX):
                os.setxattr(dst, attr, os.getxattr(src, attr))
    except OSError as exc:
        if exc.errno not in (*_UNSUPPORTED, errno.ENODATA):
            raise


def _holds_metadata(st: os.stat_result) -> bool:
    """A directory, or a regular file with one link: another may be a host file's name (planted by a hard link),
    whose attributes are neither read nor written here."""
    return (stat.S_ISREG(st.st_mode) and st.st_nlink == 1) or stat.S_ISDIR(st.st_mode)


def _listed(proc: str) -> list[str]:
    """The names in our namespace that are UTF-8 (a name that is not decodes with surrogates); none where the
    filesystem keeps no attributes."""
    try:
        names = os.listxattr(proc)
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return []
        raise
    return [n for n in names if n.startswith(PREFIX) and _is_utf8(n)]


def _value(proc: str, attr: str) -> str | None:
    """The attribute's value; None if it is not UTF-8 or was removed since it was listed."""
    try:
        return os.getxattr(proc, attr).decode()
    except UnicodeDecodeError:
        return None
    except OSError as exc:
        if exc.errno == errno.ENODATA:
            return None
        raise


def _is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
