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

#: How long the stops may take to land before the block goes ahead anyway. A runnable process takes its stop when
#: it is next scheduled, which on a loaded machine can be well past a few passes: it is waited for (up to the
#: longer bound). One in the kernel's uninterruptible sleep (D, e.g. on a slow disk) takes it only when it leaves
#: that: the block goes ahead after the shorter bound when only such processes are left.
_SETTLE_SECONDS = 10.0
_SETTLE_UNINTERRUPTIBLE_SECONDS = 1.0
#: Passes that find processes not stopped yet (each forked just before its parent's stop) before giving up.
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
    started = time.monotonic()
    passes = 0
    while True:
        found = [pid for pid in _trees(roots) if pid not in keep and pid not in halted]
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                halted.append(pid)
        passes += bool(found)
        waiting = [state for pid in halted if (state := _state(pid)) not in _STOPPED]
        if not found and not waiting:
            return
        elapsed = time.monotonic() - started
        if passes >= _MAX_PASSES or elapsed > _SETTLE_SECONDS:
            return
        if not found and elapsed > _SETTLE_UNINTERRUPTIBLE_SECONDS and all(state == "D" for state in waiting):
            return
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


#: States of a process that runs no more: stopped, traced, a zombie, dead ("" : gone from /proc).
_STOPPED = frozenset({"T", "t", "Z", "X", ""})


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
