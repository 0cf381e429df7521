"""Hold process trees still for a block: a snapshot copies a state none of them changes meanwhile, and a paused
sandbox (``execspace serve``) runs nothing until it is resumed.

How a tree is held is a :class:`Hold`, which the backend that started it chooses (:class:`Freezer`):

* a cgroup freezer (the sandbox backend's, as root: ``execspace.backends.sandbox.cgroups``): the kernel holds
  every process of the group whatever signals they send each other, and a process it starts is born held;
* signals (:class:`StoppedTree`, everywhere else): every process of the trees under the roots, found through
  ``/proc/<pid>/task/<tid>/children``, is sent ``SIGSTOP``. A stopped process forks no more, but one not stopped
  yet (a sibling, or any process of the same uid outside the tree) can wake it with ``SIGCONT``.

:func:`held` makes passes (:meth:`Hold.sweep`: hold what is not held, a process forked or woken since the last
pass included) until one finds everything held, for at most :data:`SETTLE_SECONDS`; a tree that does not settle by
then is let go on (everything stopped is continued) and :class:`~execspace.errors.FreezeFailed` says so. Once
settled, a watcher thread keeps making passes for the whole block, so a process woken or started meanwhile is held
again within :data:`_MAX_INTERVAL`. Only pids found in the trees (or groups) are signalled or moved.

At the end of the block, when every hold can let everything run again at once (:meth:`Hold.let_go`: a thawed
cgroup), they do, and the watcher's thread tidies up after its last pass (:meth:`Hold.release`) on its own, so that
whoever leaves the block (a paused sandbox's next request) waits for no other thread or process to be scheduled.
Otherwise the block ends once the thread has and everything was released: signals are sent only after the last
pass (a stop of that pass would undo them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Sequence
from typing import Protocol

from ..errors import FreezeFailed
from .proctree import children

__all__ = ["SETTLE_SECONDS", "Freezer", "Hold", "StoppedTree", "held", "stop_signals"]

_log = logging.getLogger("execspace.freezing")

#: How long a tree may take to be held entirely before the freeze fails. A runnable process takes its stop when
#: it is next scheduled, which on a loaded machine can be well past a few passes: it is waited for.
SETTLE_SECONDS = 5.0
#: How long every process of a tree held by signals must be seen stopped, pass after pass, before it counts as held:
#: one pass that happens to find them all stopped between two wakes of a process outside the tree is not a hold.
_QUIET_SECONDS = 0.02
#: A process in the kernel's uninterruptible sleep (D, e.g. on a slow disk) takes its stop only when it leaves that,
#: and runs nothing of its own until then: past this, it counts as held (its stop is pending, and is sent again on
#: every pass).
_UNINTERRUPTIBLE_SECONDS = 1.0
#: The watcher's passes: the first right after the tree settled, then further apart while they find nothing to
#: hold, back to the first as soon as one does.
_FIRST_INTERVAL = 0.001
_MAX_INTERVAL = 0.05


class Hold(Protocol):
    """One way of holding a tree of processes still (see the module)."""

    def sweep(self, stop: threading.Event) -> str | None:
        """Hold what is not held yet; None when this pass found everything held already, else what it found not
        held (for :class:`FreezeFailed`). May end early, as not settled, once ``stop`` is set."""
        ...

    def let_go(self) -> bool:
        """Let every process held run again now, while a sweep may still be under way; False where only
        :meth:`release` can, after the last sweep (signals, which that sweep could undo)."""
        ...

    def release(self) -> None:
        """Let every process this hold stopped continue (what :meth:`let_go` did not), and tidy up. Called once,
        after the last sweep."""
        ...


#: How a backend holds the tree of a process it started: ``(roots, keep)`` → a :class:`Hold` of the processes
#: under ``roots``, except ``keep`` and their ancestors (e.g. a session's supervisor, which keeps answering).
Freezer = Callable[[Sequence[int], Collection[int]], Hold]


def stop_signals(roots: Sequence[int], keep: Collection[int]) -> Hold:
    """The :class:`Freezer` of a process without a backend's own: :class:`StoppedTree`."""
    return StoppedTree(roots, keep)


@contextlib.asynccontextmanager
async def held(holds: Iterable[Hold]) -> AsyncIterator[None]:
    """Every process of ``holds`` held still for the body of the block (which may outlive the task that entered
    it); they continue afterwards, also when the body raises.

    Raises:
        FreezeFailed: the trees were not all held within :data:`SETTLE_SECONDS`; everything stopped continues.
    """
    watcher = _Watcher(list(holds))
    try:
        await watcher.settled()
    except BaseException:
        watcher.close()
        raise
    try:
        yield
    finally:
        watcher.close()


class _Watcher:
    """The thread that settles the holds, then keeps them held until :meth:`close`."""

    def __init__(self, holds: list[Hold]) -> None:
        self._holds = holds
        self._stop = threading.Event()
        self._loop = asyncio.get_running_loop()
        self._settled: asyncio.Future[str | None] = self._loop.create_future()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._ending = threading.Lock()
        self._over = False
        """The thread has made its last pass."""
        self._detached = False
        """:meth:`close` left the releases to the thread."""
        if holds:
            self._thread = threading.Thread(target=self._run, name="execspace-freeze", daemon=True)
            self._thread.start()
        else:
            self._settled.set_result(None)

    async def settled(self) -> None:
        unsettled = await asyncio.shield(self._settled)
        if unsettled is not None:
            raise FreezeFailed(
                f"the programs could not all be stopped within {SETTLE_SECONDS:g} s ({unsettled}): they keep "
                "waking each other or starting new processes. Everything stopped was let continue; retry, stop the "
                "programs that resist first, or run as root, where the cgroup freezer holds any tree"
            )

    def close(self) -> None:
        """Stop the watcher (its pass ends at once) and let everything held continue: at once where every hold
        can (the thread then releases them after its pass), else once the thread has ended. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if all([hold.let_go() for hold in self._holds]):  # every one let go: no short cut
            with self._ending:
                self._detached = not self._over
            if self._detached:
                return
        if self._thread is not None:
            self._thread.join()
        self._release()

    def _release(self) -> None:
        for hold in self._holds:
            try:
                hold.release()
            except Exception:
                _log.exception("letting a held process tree continue: a release failed")

    def _run(self) -> None:
        try:
            self._watch()
        finally:
            with self._ending:
                self._over = True
                detached = self._detached
            if detached:
                self._release()

    def _watch(self) -> None:
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            try:
                unsettled = self._sweep()
            except Exception as exc:  # a hold that cannot work (its frozen group cannot be made): fail at once
                self._report(f"{type(exc).__name__}: {exc}")
                return
            if unsettled is None:
                break
            # stops and freezes land asynchronously: let them, then look again
            if time.monotonic() > deadline or self._stop.wait(0.001):
                self._report(unsettled)
                return
        self._report(None)
        interval = _FIRST_INTERVAL
        while not self._stop.wait(interval):
            try:
                found = self._sweep() is not None
            except Exception:
                _log.exception("holding a process tree still: a pass failed; the next one tries again")
                found = True
            interval = _FIRST_INTERVAL if found else min(interval * 2, _MAX_INTERVAL)

    def _sweep(self) -> str | None:
        found = [text for hold in self._holds if (text := hold.sweep(self._stop)) is not None]
        return "; ".join(found) if found else None

    def _report(self, unsettled: str | None) -> None:
        def report() -> None:
            if not self._settled.done():
                self._settled.set_result(unsettled)

        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits for it any more
            self._loop.call_soon_threadsafe(report)


class StoppedTree:
    """A :class:`Hold` by signals: ``SIGSTOP`` to every process of the trees under ``roots`` (``keep``: pids left
    running, with their ancestors; their descendants not), on every pass to each one not stopped; ``SIGCONT`` to
    each one stopped, at the end."""

    def __init__(self, roots: Sequence[int], keep: Collection[int] = ()) -> None:
        self._roots = list(roots)
        self._keep = frozenset(keep)
        self._halted: dict[int, bytes] = {}
        """pid → its start time: what was stopped here (a pid reused meanwhile is not continued)."""
        self._groups: set[int] = set()
        """Process groups stopped whole here (of sessions a process of the trees began)."""
        self._started = time.monotonic()
        self._quiet_since: float | None = None
        """When the passes began to find every process stopped (None: the last one did not)."""

    def let_go(self) -> bool:
        """Never: a ``SIGCONT`` sent while a pass may still send ``SIGSTOP`` would be undone."""
        return False

    def sweep(self, stop: threading.Event) -> str | None:
        running: list[int] = []
        waiting: list[int] = []
        seen = [(pid, *_task_states(pid)) for pid in _trees(self._roots, self._keep)]
        moving = [(pid, states, started) for pid, states, started in seen if started is not None and states - _STOPPED]
        if moving:
            # processes that wake each other (SIGCONT to their group) outrun stops sent one by one: a group of a
            # session the trees began is stopped in one call first, so that none of it is left to wake another
            for group in _groups_of([pid for pid, _, _ in seen]):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, signal.SIGSTOP)
                    self._groups.add(group)
        for pid, states, started in moving:
            if stop.is_set():
                return "interrupted"
            assert started is not None
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
                self._halted.setdefault(pid, started)
            (waiting if states - _STOPPED == {"D"} else running).append(pid)
        now = time.monotonic()
        if waiting and now - self._started > _UNINTERRUPTIBLE_SECONDS:
            waiting = []  # stopped once they leave the kernel; they run nothing of their own until then
        if running or waiting:
            self._quiet_since = None
            return _not_held(running + waiting)
        if self._quiet_since is None:
            self._quiet_since = now
        if now - self._quiet_since < _QUIET_SECONDS:
            return "every process stopped, for less than a moment yet"
        return None

    def release(self) -> None:
        alive = [pid for pid, started in self._halted.items() if _task_states(pid)[1] == started]
        # a group stopped whole is continued whole while a process stopped here is in it (its id is then still it)
        for group in self._groups & {_ids(pid)[0] for pid in alive}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGCONT)
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGCONT)


def _not_held(pids: list[int]) -> str:
    shown = ", ".join(str(p) for p in sorted(pids)[:5])
    return f"{len(pids)} process{'es' if len(pids) != 1 else ''} still running (pid {shown}{', …' * (len(pids) > 5)})"


def _trees(roots: list[int], keep: frozenset[int]) -> list[int]:
    """The processes under ``roots`` (the roots included), except ``keep`` and their ancestors."""
    pids: list[int] = []
    seen: set[int] = set()
    spared: set[int] = set()
    pending: list[tuple[int, tuple[int, ...]]] = [(pid, ()) for pid in roots]
    while pending:
        pid, path = pending.pop()
        if pid in seen:
            continue
        seen.add(pid)
        if pid in keep:
            spared.update(path)
        pids.append(pid)
        pending += [(child, (*path, pid)) for child in children(pid)]
    return [pid for pid in pids if pid not in keep and pid not in spared]


def _groups_of(pids: list[int]) -> set[int]:
    """The process groups of ``pids`` that belong to a session one of them began: every member descends from the
    trees (a session is inherited, and nobody outside joins it)."""
    tree = set(pids)
    groups: set[int] = set()
    for pid in pids:
        group, session = _ids(pid)
        if session in tree and group > 0:
            groups.add(group)
    return groups


def _ids(pid: int) -> tuple[int, int]:
    """The process group and session of ``pid`` (0, 0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[2]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return 0, 0


#: States of a thread that runs no more: stopped, traced, a zombie, dead.
_STOPPED = frozenset({"T", "t", "Z", "X"})


def _task_states(pid: int) -> tuple[set[str], bytes | None]:
    """The states of every thread of ``pid`` (one whose main thread ended still runs its others), and its start
    time (None: it is gone)."""
    states: set[str] = set()
    started: bytes | None = None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            started = f.read().rsplit(b")", 1)[1].split()[19]
        tids = os.listdir(f"/proc/{pid}/task")
    except (OSError, IndexError):
        return states, None
    for tid in tids:
        with contextlib.suppress(OSError, IndexError), open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
            states.add(f.read().rsplit(b")", 1)[1].split()[0].decode())
    return states, started
