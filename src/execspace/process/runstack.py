"""The exit stack of one run: what the steps that planned it opened for it, released once it is over."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from ..models import RunResult

__all__ = ["RunStack"]


class RunStack:
    """What the steps of one run opened for it (an fd, a proxy, a cgroup, a placeholder), owned by the run.

    A step registers each thing it opens as it opens it; every plan made from the run's first one carries the same
    stack. Three moments release them: once the process is started or failed to start (:meth:`spawned`: fds only
    the child needed), once the run is over — exited, killed, or never started — (:meth:`close`, in reverse order
    of registration, each callback even if one before it raised), and on its result (:meth:`annotated`).
    """

    __slots__ = ("_exit", "_notes", "_spawned")

    def __init__(self) -> None:
        self._exit = contextlib.ExitStack()
        self._spawned: list[Callable[[], object]] = []
        self._notes: list[Callable[[RunResult], RunResult]] = []

    def callback(self, release: Callable[[], object]) -> None:
        """Call ``release`` once the run is over."""
        self._exit.callback(release)

    def after_spawn(self, release: Callable[[], object]) -> None:
        """Call ``release`` once the process is started, or failed to start."""
        self._spawned.append(release)

    def annotate(self, note: Callable[[RunResult], RunResult]) -> None:
        """Let ``note`` add what its step knows to the run's result (e.g. the egress proxy's audit)."""
        self._notes.append(note)

    def spawned(self) -> None:
        """The process is started or failed to start: release what only the start needed, once."""
        releases, self._spawned = self._spawned, []
        with contextlib.ExitStack() as stack:
            for release in releases:
                stack.callback(release)

    def close(self) -> None:
        """The run is over: release what its steps opened, newest first, once."""
        self._exit.close()

    def abandon(self) -> None:
        """The run is over before its process was started (a step failed): everything is released, once."""
        self._notes.clear()
        try:
            self.close()
        finally:
            self.spawned()

    def annotated(self, result: RunResult) -> RunResult:
        """``result`` with what the steps know added."""
        for note in self._notes:
            result = note(result)
        return result
