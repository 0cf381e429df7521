"""Watching a directory: what the sandbox's file API writes is told to the watches as envd's inotify reports it,
and the rest (what programs do) is found by polling the Engine's file API.

envd reports an upload of a new file as ``CREATE``, ``CHMOD`` (its chown) and ``WRITE``, of an existing one as
``CHMOD`` and ``WRITE`` (the truncation, then the bytes), and metadata set on it as one more ``CHMOD``: an upload
here gives the same events, in that order, whether the file API wrote it in one step or many. A poll sees the
changes between two looks: a program's new entry is ``CREATE`` (then ``WRITE`` if it holds bytes), a changed file
``WRITE``, a vanished one ``REMOVE``; several writes between two looks are one, and no ``RENAME`` or ``CHMOD`` is
seen. While an upload is under way, its path and the new file it is written to beside it are left to the upload:
a poll neither reports nor records them.
"""

from __future__ import annotations

import posixpath
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from wcmatch import glob as wglob

from ..models import FileEntry, FileKind, Workspace
from ..protocols import WorkspaceFS

__all__ = ["Change", "DirectoryWatch", "Upload", "Watches"]

_State = tuple[FileKind, int, float]
Kind = Literal["create", "write", "remove", "chmod"]


@dataclass(frozen=True, slots=True)
class Change:
    kind: Kind
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
        self._recursive = recursive
        self._pattern = wglob.escape(directory) + ("/**" if recursive else "/*")
        self._last: dict[str, tuple[_State, FileEntry]] = {}
        self._told: list[Change] = []
        self._uploading: Counter[str] = Counter()
        self._pass = 0
        self._settled: dict[str, int] = {}
        """Paths whose upload ended, with the poll under way then: that poll's walk may have seen them before."""

    def covers(self, path: str) -> bool:
        """Whether a change at the workspace path ``path`` is one of this watch's."""
        if not path.startswith(self._directory + "/"):
            return False
        return self._recursive or "/" not in path[len(self._directory) + 1 :]

    async def start(self) -> None:
        self._last = await self._snapshot()

    async def changes(self) -> list[Change]:
        """What the polls found since the previous look, then what uploads told, each in its order."""
        self._pass += 1
        this = self._pass
        now = await self._snapshot()
        held = {p for p, at in self._settled.items() if at >= this}
        self._settled = {p: at for p, at in self._settled.items() if at >= this}
        found: list[Change] = []
        for path, (state, entry) in now.items():
            if self._held(path, held):
                continue
            before = self._last.get(path)
            if before is None:
                found.append(Change("create", self._name(path), entry))
                if state[0] is FileKind.FILE and state[1] > 0:
                    found.append(Change("write", self._name(path), entry))
            elif before[0] != state and state[0] is FileKind.FILE:
                found.append(Change("write", self._name(path), entry))
        gone = [p for p in self._last if p not in now and not self._held(p, held)]
        found.extend(Change("remove", self._name(p), None) for p in gone)
        kept = {p: v for p, v in self._last.items() if self._held(p, held)}
        self._last = {**{p: v for p, v in now.items() if not self._held(p, held)}, **kept}
        found.extend(self._told)
        self._told.clear()
        return found

    def upload_begins(self, path: str) -> None:
        self._uploading[path] += 1

    def upload_ends(self, path: str) -> None:
        self._uploading[path] -= 1
        if self._uploading[path] <= 0:
            del self._uploading[path]
        self._settled[path] = self._pass

    def uploaded(self, path: str, entry: FileEntry, *, tagged: bool) -> None:
        """The file API wrote the file ``path``, now ``entry`` (``tagged``: and set metadata on it)."""
        name = self._name(path)
        if path in self._last:
            kinds: list[Kind] = ["chmod", "write"]  # the chown, then the truncation
        else:
            kinds = ["create", "chmod", "write"] if entry.size else ["create", "chmod"]  # nothing written, no write
        self._told.extend(Change(kind, name, entry) for kind in kinds + (["chmod"] if tagged else []))
        self._last[path] = ((entry.kind, entry.size, entry.mtime), entry)

    def _held(self, path: str, settled: set[str]) -> bool:
        """Whether ``path`` is an upload's to report: the target, or the file beside it it writes to, of an
        upload under way or of one that ended while this poll's walk ran."""
        if path in settled or path in self._uploading:
            return True
        parent, base = posixpath.split(path)
        return base.endswith(".tmp") and any(
            posixpath.dirname(target) == parent and base.startswith(f".{posixpath.basename(target)[:40]}.")
            for target in (*self._uploading, *settled)
        )

    def _name(self, path: str) -> str:
        return path[len(self._directory) + 1 :]

    async def _snapshot(self) -> dict[str, tuple[_State, FileEntry]]:
        entries = await self._fs.list(self._ws, [self._pattern])
        return {e.path: ((e.kind, e.size, e.mtime), e) for e in entries if e.path != self._directory}


class Upload:
    """One file the file API is writing, and the watches that see it (see :meth:`Watches.upload`)."""

    def __init__(self, path: str, watches: list[DirectoryWatch]) -> None:
        self.path = path
        self.watches = watches

    def wrote(self, entry: FileEntry, *, tagged: bool) -> None:
        for watch in self.watches:
            watch.uploaded(self.path, entry, tagged=tagged)


class Watches:
    """The live directory watches of one sandbox, polled and streamed."""

    def __init__(self) -> None:
        self._live: set[DirectoryWatch] = set()

    def add(self, watch: DirectoryWatch) -> None:
        self._live.add(watch)

    def discard(self, watch: DirectoryWatch) -> None:
        self._live.discard(watch)

    @contextmanager
    def upload(self, path: str) -> Iterator[Upload]:
        """While the file API writes the file ``path``: the watches that cover it leave it to the upload, which
        tells them what it wrote (:meth:`Upload.wrote`); if it writes nothing, the next poll sees what is there."""
        upload = Upload(path, [w for w in self._live if w.covers(path)])
        for watch in upload.watches:
            watch.upload_begins(path)
        try:
            yield upload
        finally:
            for watch in upload.watches:
                watch.upload_ends(path)
