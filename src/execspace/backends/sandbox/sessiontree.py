"""A session's process tree as the host sees it in ``/proc``: the supervisor below bwrap, and the marked
leftovers of a run that a run's teardown kills."""

from __future__ import annotations

import contextlib
import os
import signal

from ...process.supervisor import RUN_MARKER_VAR

__all__ = ["kill_marked_children", "last_pid", "only_child", "open_children"]


def last_pid() -> int:
    """The host's last pid handed out: every process a run starts after this has a larger one (until the
    counter wraps, which the marker sweep notices)."""
    try:
        with open("/proc/sys/kernel/ns_last_pid", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


def only_child(pid: int | None) -> int | None:
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


def open_children(pid: int | None) -> int | None:
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
