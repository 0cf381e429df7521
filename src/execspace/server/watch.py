"""Watching a directory by polling the Engine's file API (envd uses inotify; a poll sees the same changes, later,
and folds several writes between two polls into one)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from wcmatch import glob as wglob

from ..models import FileEntry, FileKind, Workspace
from ..protocols import WorkspaceFS

__all__ = ["Change", "DirectoryWatch"]

_State = tuple[FileKind, int, float]


@dataclass(frozen=True, slots=True)
class Change:
    kind: Literal["create", "write", "remove"]
    name: str
    """Path relative to the watched directory."""
    entry: FileEntry | None
    """The entry now (None once removed)."""


class DirectoryWatch:
    """The changes under one workspace directory since the previous look."""

    def __init__(self, fs: WorkspaceFS, ws: Workspace, directory: str, *, recursive: bool) -> None:
        self._fs = fs
        self._ws = ws
        self._directory = directory
        self._pattern = wglob.escape(directory) + ("/**" if recursive else "/*")
        self._last: dict[str, tuple[_State, FileEntry]] = {}

    async def start(self) -> None:
        self._last = await self._snapshot()

    async def changes(self) -> list[Change]:
        now = await self._snapshot()
        found: list[Change] = []
        for path, (state, entry) in now.items():
            before = self._last.get(path)
            name = path[len(self._directory) + 1 :]
            if before is None:
                found.append(Change("create", name, entry))
                if state[0] is FileKind.FILE and state[1] > 0:
                    found.append(Change("write", name, entry))
            elif before[0] != state and state[0] is FileKind.FILE:
                found.append(Change("write", name, entry))
        found.extend(Change("remove", p[len(self._directory) + 1 :], None) for p in self._last if p not in now)
        self._last = now
        return found

    async def _snapshot(self) -> dict[str, tuple[_State, FileEntry]]:
        entries = await self._fs.list(self._ws, [self._pattern])
        return {e.path: ((e.kind, e.size, e.mtime), e) for e in entries if e.path != self._directory}
