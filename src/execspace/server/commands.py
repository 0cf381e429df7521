"""The commands running in one sandbox, each followed by any number of streams (``Start``, then ``Connect``s).

A pump task reads the program's output once and hands every chunk to each stream following it; a stream that does
not keep up holds the pump back (bounded queues), as a full pipe would. A command leaves the table when it exits,
after its followers got its end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import ExecspaceError
from ..models import OutputChunk, RunProgramSpec, RunResult, Workspace
from ..protocols import Engine, ProgramHandle

__all__ = ["Command", "CommandConfig", "CommandNotFound", "Commands", "Follower"]

#: Chunks one follower may have waiting before the program's output is held back.
_FOLLOWER_QUEUE = 256


class CommandNotFound(ExecspaceError, LookupError):
    """No running command has that pid or tag in this sandbox."""


class _End:
    """Queued after the last chunk."""


_END = _End()


@dataclass(frozen=True, slots=True)
class CommandConfig:
    """A command as the SDK gave it (``List`` reports this)."""

    cmd: str
    args: Sequence[str]
    envs: Mapping[str, str]
    cwd: str | None


@dataclass(slots=True)
class Command:
    pid: int
    tag: str | None
    config: CommandConfig
    handle: ProgramHandle
    followers: set[asyncio.Queue[OutputChunk | _End]] = field(default_factory=set)
    result: RunResult | None = None
    error: str | None = None
    """Why following the program failed, when it did."""


class Follower:
    """One stream's view of a command: its output from the moment it began following, then the end."""

    def __init__(self, command: Command) -> None:
        self.command = command
        self._queue: asyncio.Queue[OutputChunk | _End] = asyncio.Queue(_FOLLOWER_QUEUE)
        command.followers.add(self._queue)

    async def next(self) -> OutputChunk | None:
        """The next chunk, or None once the command has ended (its ``result`` is then set)."""
        item = await self._queue.get()
        return None if isinstance(item, _End) else item

    def close(self) -> None:
        self.command.followers.discard(self._queue)
        while not self._queue.empty():  # a pump blocked on this queue goes on
            self._queue.get_nowait()


class Commands:
    """The table of one sandbox's running commands."""

    def __init__(self, engine: Engine, ws: Workspace) -> None:
        self._engine = engine
        self._ws = ws
        self._running: dict[int, Command] = {}
        self._pumps: set[asyncio.Task[None]] = set()

    def all(self) -> list[Command]:
        return list(self._running.values())

    def find(self, pid: int | None = None, tag: str | None = None) -> Command:
        for command in self._running.values():
            if (pid is not None and command.pid == pid) or (tag is not None and command.tag == tag):
                return command
        raise CommandNotFound(f"no running process with {'pid ' + str(pid) if pid is not None else f'tag {tag!r}'}")

    async def start(
        self, spec: RunProgramSpec, config: CommandConfig, *, tag: str | None, stdin: bool
    ) -> tuple[Command, Follower]:
        """Start a command; the follower returned sees all of its output."""
        if tag is not None and any(c.tag == tag for c in self._running.values()):
            raise CommandNotFound(f"a process with tag {tag!r} already runs")
        handle = await self._engine.runner.start_program(self._ws, spec)
        if not stdin:
            await handle.close_stdin()
        pid = handle.pid or 0
        command = Command(pid, tag, config, handle)
        follower = Follower(command)
        self._running[pid] = command
        pump = asyncio.create_task(self._pump(command))
        self._pumps.add(pump)
        pump.add_done_callback(self._pumps.discard)
        return command, follower

    async def _pump(self, command: Command) -> None:
        try:
            async for chunk in command.handle.stream():
                for queue in list(command.followers):
                    await queue.put(chunk)
            command.result = await command.handle.wait()
        except Exception as exc:  # the followers must still end, and say why
            command.error = f"following the process failed: {exc}"
            with contextlib.suppress(Exception):
                await command.handle.kill()
        finally:
            self._running.pop(command.pid, None)
            for queue in list(command.followers):
                if queue.full():
                    queue.get_nowait()  # a stalled follower loses one chunk so that it sees the end
                queue.put_nowait(_END)
