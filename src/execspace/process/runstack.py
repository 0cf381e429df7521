"""The exit stack of one run: what the steps that planned it opened for it, released once it is over."""

from __future__ import annotations

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

    # plain lists, not contextlib.ExitStack: a session run is a few hundred Python calls, an ExitStack a tenth more
    __slots__ = ("_exit", "_notes", "_spawned")

    def __init__(self) -> None:
        self._exit: list[Callable[[], object]] = []
        self._spawned: list[Callable[[], object]] = []
        self._notes: list[Callable[[RunResult], RunResult]] = []

    def callback(self, release: Callable[[], object]) -> None:
        """Call ``release`` once the run is over."""
        self._exit.append(release)

    def after_spawn(self, release: Callable[[], object]) -> None:
        """Call ``release`` once the process is started, or failed to start."""
        self._spawned.append(release)

    def annotate(self, note: Callable[[RunResult], RunResult]) -> None:
        """Let ``note`` add what its step knows to the run's result (e.g. the egress proxy's audit)."""
        self._notes.append(note)

    def spawned(self) -> None:
        """The process is started or failed to start: release what only the start needed, once."""
        releases, self._spawned = self._spawned, []
        _release_all(releases)

    def close(self) -> None:
        """The run is over: release what its steps opened, newest first, once."""
        releases, self._exit = self._exit, []
        releases.reverse()
        _release_all(releases)

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


def _release_all(releases: list[Callable[[], object]]) -> None:
    """Call each of ``releases`` in turn, every one even when one before it raised; then raise the first error."""
    error: BaseException | None = None
    for release in releases:
        try:
            release()
        except BaseException as exc:  # the others are released all the same
            error = error or exc
    if error is not None:
        raise error
