"""What every runner shares for programs that outlive the call that started them.

:class:`ProgramTable` answers ``list_programs`` and ``get_program``: the programs a runner started with
``start_program``, by workspace, until they exit. :class:`OutputLog` lets any number of readers attach to
one program's output (from its start, or from now) without ever slowing the program: a reader that falls
too far behind is cut off with an error instead of holding the pipes.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..audit import AuditSink, AuditValue, run_ended, run_lost, run_started
from ..errors import BackendError, ProgramNotFound
from ..models import OutputChunk, ProgramInfo, RunProgramSpec, RunResult, Workspace
from ..tracing import Span, record_run

if TYPE_CHECKING:
    from ..protocols import ProgramHandle

__all__ = ["OutputLog", "ProgramTable", "RunLines", "StartedProgram", "program_info"]

#: Bytes of a program's first output kept for readers that attach "from the start" later.
HISTORY_BYTES = 1024 * 1024
#: Bytes an attached reader may fall behind before it is cut off.
READER_BUFFER = 4 * 1024 * 1024


def program_info(spec: RunProgramSpec, pid: int) -> ProgramInfo:
    """What ``list_programs`` reports of a program started from ``spec``."""
    return ProgramInfo(
        pid=pid, cmd=spec.cmd, args=tuple(spec.args), cwd=spec.cwd, env=dict(spec.env), tag=spec.tag, pty=spec.pty
    )


@dataclass(frozen=True, slots=True)
class RunLines:
    """One run's ``command.start`` and ``command.end`` audit lines (:func:`~execspace.audit.run_started`,
    :func:`~execspace.audit.run_ended`), for a runner whose programs are not host processes of ours: with
    ``where`` it ran added to each (a container's id, a remote sandbox's)."""

    audit: AuditSink
    workspace: str
    spec: RunProgramSpec
    where: Mapping[str, AuditValue]

    def started(self) -> None:
        self.audit.record("command.start", {**run_started(self.workspace, self.spec), **self.where})

    def ended(self, pid: int | None, result: RunResult) -> None:
        self.audit.record("command.end", {**run_ended(self.workspace, self.spec, pid, result), **self.where})

    def lost(self, pid: int | None, error: BaseException) -> None:
        """The run ended without a result (its start or its supervision failed, or was cancelled)."""
        self.audit.record("command.end", {**run_lost(self.workspace, self.spec, pid, error), **self.where})


class StartedProgram:
    """What a started program's handle says of itself, for handles whose program is not a host process of ours
    (a container's exec, a remote command): its :class:`ProgramInfo` and the future of its supervision."""

    _info: ProgramInfo
    _done: asyncio.Future[RunResult] | None

    @property
    def pid(self) -> int | None:
        """The id ``ProgramInfo.pid`` reports (None before the backend gave one)."""
        return self._info.pid or None

    @property
    def info(self) -> ProgramInfo:
        return self._info

    @property
    def finished(self) -> bool:
        """Supervision is over: the result is in."""
        return self._done is not None and self._done.done()

    def when_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the run is over (at once if it is)."""
        assert self._done is not None
        self._done.add_done_callback(lambda _f: callback())

    def ends(self, span: Span) -> None:
        """End the run's span once the run is over, with its result (or the error that ended supervision)."""
        assert self._done is not None

        def end(done: asyncio.Future[RunResult]) -> None:
            if done.cancelled():
                span.failed(asyncio.CancelledError())
            elif (error := done.exception()) is not None:
                span.failed(error)
            else:
                record_run(span, done.result())
            span.end()

        self._done.add_done_callback(end)

    def audited(self, lines: RunLines) -> None:
        """Write the run's ``command.end`` line once it is over. Called before the handle is anyone's: this
        callback then comes before any waiter's, so the line is written before ``wait()`` returns the result."""
        assert self._done is not None

        def end(done: asyncio.Future[RunResult]) -> None:
            if done.cancelled():
                lines.lost(self.pid, asyncio.CancelledError())
            elif (error := done.exception()) is not None:
                lines.lost(self.pid, error)
            else:
                lines.ended(self.pid, done.result())

        self._done.add_done_callback(end)


class _Reader:
    __slots__ = ("overflowed", "queue", "room")

    def __init__(self, room: int) -> None:
        self.queue: asyncio.Queue[OutputChunk | None] = asyncio.Queue()
        self.room = room
        self.overflowed = False


class OutputLog:
    """One program's output for attached readers: the first ``history`` bytes, then live fan-out."""

    def __init__(self, *, history: int = HISTORY_BYTES, reader_buffer: int = READER_BUFFER) -> None:
        self._history: list[OutputChunk] = []
        self._history_room = history
        self._reader_buffer = reader_buffer
        self._readers: set[_Reader] = set()
        self._closed = False

    def append(self, chunk: OutputChunk) -> None:
        if self._history_room >= len(chunk.data):
            self._history.append(chunk)
            self._history_room -= len(chunk.data)
        else:
            self._history_room = -1  # full: the history stays a prefix of the output
        for reader in self._readers:
            if reader.overflowed:
                continue
            reader.room -= len(chunk.data)
            if reader.room < 0:
                reader.overflowed = True
                reader.queue.put_nowait(None)
            else:
                reader.queue.put_nowait(chunk)

    def close(self) -> None:
        """The output has ended: every reader ends after what it has."""
        if self._closed:
            return
        self._closed = True
        for reader in self._readers:
            if not reader.overflowed:
                reader.queue.put_nowait(None)

    def attach(self, *, from_start: bool = True) -> AsyncIterator[OutputChunk]:
        """The output from now (and the kept history first when ``from_start``), until it ends.

        The reader is registered by this call, not by the first iteration: nothing written after it returns is
        missed. Iterating it raises ``BackendError`` if it fell more than the reader buffer behind.
        """
        reader = _Reader(self._reader_buffer)
        for early in self._history if from_start else ():
            reader.queue.put_nowait(early)
        if self._closed:
            reader.queue.put_nowait(None)
        else:
            self._readers.add(reader)
        return self._read(reader)

    async def _read(self, reader: _Reader) -> AsyncIterator[OutputChunk]:
        try:
            while (chunk := await reader.queue.get()) is not None:
                reader.room += len(chunk.data)
                yield chunk
            if reader.overflowed:
                raise BackendError(
                    f"an attached reader fell more than {self._reader_buffer} bytes behind the program's output "
                    "and was cut off: read faster, or attach again with from_start=False"
                )
        finally:
            self._readers.discard(reader)


class ProgramTable:
    """The running programs a runner started with ``start_program``, by workspace.

    A program is listed from its start until it exits; the runner calls :meth:`add` once the handle has a pid
    and :meth:`discard` (the callable :meth:`add` returns) when it is over.
    """

    def __init__(self) -> None:
        self._by_workspace: dict[str, dict[int, ProgramHandle]] = {}
        self._order = itertools.count()
        self._started: dict[int, int] = {}  # id(handle) -> start order, for "newest with that tag"

    @staticmethod
    def _key(ws: Workspace) -> str:
        return str(ws.host_path) if ws.host_path is not None else f"{ws.backend}:{ws.id}"

    def add(self, ws: Workspace, handle: ProgramHandle) -> Callable[[], None]:
        """Register ``handle`` (its ``info.pid`` must be set); return the call that forgets it."""
        key = self._key(ws)
        pid = handle.info.pid
        programs = self._by_workspace.setdefault(key, {})
        programs[pid] = handle
        self._started[id(handle)] = next(self._order)

        def discard() -> None:
            if programs.get(pid) is handle:
                del programs[pid]
                self._started.pop(id(handle), None)
            if not programs and self._by_workspace.get(key) is programs:
                del self._by_workspace[key]

        return discard

    def list(self, ws: Workspace) -> list[ProgramInfo]:
        programs = self._by_workspace.get(self._key(ws), {})
        handles = sorted(programs.values(), key=lambda h: self._started.get(id(h), 0))
        return [h.info for h in handles]

    def get(self, ws: Workspace, key: int | str) -> ProgramHandle:
        programs = self._by_workspace.get(self._key(ws), {})
        if isinstance(key, int) and not isinstance(key, bool):
            found = programs.get(key)
        else:
            tagged = [h for h in programs.values() if h.info.tag == key]
            found = max(tagged, key=lambda h: self._started.get(id(h), 0), default=None)
        if found is None:
            what = f"pid {key}" if isinstance(key, int) else f"tag {key!r}"
            raise ProgramNotFound(
                f"no running program with {what} in workspace {ws.id!r}: it ended or never started there; "
                "runner.list_programs(ws) lists the running ones"
            )
        return found
