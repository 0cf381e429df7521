"""Whether any process of this host has a tree open: its working directory or root in it, a descriptor of one of
its files or directories, or one of its files mapped. Before a workspace's tree moves into the snapshot store
(:meth:`.branches.Branches.layer`), for the processes its engine does not know (another engine's, a shell's): a
program holding the tree would go on writing it where it moved, a frozen layer.

Only root moves trees (copy-on-write needs root), and root reads the ``/proc/<pid>`` of every process of its own
user namespace (the host's, where execspace runs); a process it may not look into (one of an enclosing namespace,
such as a container's init, without ``CAP_SYS_PTRACE`` over it) is not seen. It looks once: a process that opens the
tree afterwards is not seen either.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["open_anywhere"]

_PROC = "/proc"


def open_anywhere(inodes: set[tuple[int, int]]) -> bool:
    """Whether a process has one of ``inodes`` (``(st_dev, st_ino)`` of a tree's directories and files) open,
    as its working directory or root, a descriptor or a mapped file."""
    for pid in os.listdir(_PROC):
        if not pid.isdigit():
            continue
        try:
            if any(key in inodes for key in _held(f"{_PROC}/{pid}")):
                return True
        except OSError:
            continue  # it ended meanwhile (or is a zombie), or root may not look into it (see the module)
    return False


def _held(proc: str) -> Iterator[tuple[int, int]]:
    """What the process ``proc`` (its ``/proc`` directory) has open, as ``(st_dev, st_ino)``."""
    for link in ("cwd", "root"):
        yield _key(os.stat(f"{proc}/{link}"))
    for fd in os.listdir(f"{proc}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed meanwhile
            yield _key(os.stat(f"{proc}/fd/{fd}"))
    with open(f"{proc}/maps", "rb") as maps:
        for line in maps:
            # address perms offset dev inode [path]: dev as "major:minor" in hex, inode 0 for anonymous memory
            fields = line.split(maxsplit=5)
            if len(fields) >= 5 and fields[4] != b"0":
                major, minor = fields[3].split(b":")
                yield os.makedev(int(major, 16), int(minor, 16)), int(fields[4])


def _key(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino
