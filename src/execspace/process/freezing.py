"""Stop process trees for an instant (``SIGSTOP``, then ``SIGCONT``): a snapshot of a workspace whose programs
still run copies a state none of them changes meanwhile.

The trees are walked through ``/proc/<pid>/task/<tid>/children``, stopped from the top, and walked again until a
pass finds nobody new and everybody stopped: a process that forked just before its stop is caught by the next
pass, and a stopped one forks no more. Only pids found as descendants of the given roots are signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Collection, Iterable

__all__ = ["stopped_trees"]

#: How long the stops may take to land before the snapshot goes ahead anyway (a process in the kernel's D state).
_SETTLE_SECONDS = 1.0
_MAX_PASSES = 64


@contextlib.asynccontextmanager
async def stopped_trees(roots: Iterable[int], *, keep: Collection[int] = ()) -> AsyncIterator[None]:
    """Stop every process of the trees under ``roots`` (``keep``: pids left running, their descendants not)
    for the body of the block; they continue afterwards, also when the body raises."""
    halted: list[int] = []
    try:
        await asyncio.to_thread(_stop_all, list(roots), frozenset(keep), halted)
        yield
    finally:
        for pid in halted:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _stop_all(roots: list[int], keep: frozenset[int], halted: list[int]) -> None:
    deadline = time.monotonic() + _SETTLE_SECONDS
    for _ in range(_MAX_PASSES):
        found = [pid for pid in _trees(roots) if pid not in keep and pid not in halted]
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                halted.append(pid)
        settled = all(_stopped(pid) for pid in halted)
        if not found and (settled or time.monotonic() > deadline):
            return
        if not settled:
            time.sleep(0.001)  # the stops land asynchronously: let them, then look again


def _trees(roots: list[int]) -> list[int]:
    pids: list[int] = []
    pending = list(roots)
    while pending:
        pid = pending.pop()
        if pid in pids:
            continue
        pids.append(pid)
        pending += _children(pid)
    return pids


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # gone: nothing of it runs
    return state in ("T", "t", "Z", "X")
