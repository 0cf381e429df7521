"""Process trees seen through ``/proc``: the children of a process, and the CPU time a tree has used.

Holding a tree still (:mod:`.freezing`) walks it the same way; the CPU time is what ``execspace serve`` reads to
tell an idle sandbox from a busy one (:mod:`execspace.server.idle`) where no cgroup counts it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence

__all__ = ["CpuClock", "children", "tree_cpu_seconds"]

#: How much CPU the processes under ``roots`` have used, in seconds (a counter to compare with an earlier reading):
#: a backend's own where it counts them together (the sandbox's cgroup), else :func:`tree_cpu_seconds`.
CpuClock = Callable[[Sequence[int]], float]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def children(pid: int) -> list[int]:
    """The children of ``pid`` (of every thread of it); none when it is gone."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/task/{tid}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def tree_cpu_seconds(roots: Sequence[int]) -> float:
    """The user and system time of every process under ``roots`` (the roots included), with that of the children
    each has reaped: a process that ran and ended between two readings still counts, in its parent's. It drops
    when a process of the tree ends unreaped by the tree (a root, an orphan adopted outside)."""
    ticks = 0
    seen: set[int] = set()
    pending = list(roots)
    while pending:
        pid = pending.pop()
        if pid in seen:
            continue
        seen.add(pid)
        ticks += _ticks(pid)
        pending += children(pid)
    return ticks / _TICKS


def _ticks(pid: int) -> int:
    """utime + stime + cutime + cstime of ``pid`` (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return sum(int(v) for v in fields[11:15])
    except (OSError, IndexError, ValueError):
        return 0
