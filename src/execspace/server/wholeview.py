"""The file API beyond the home: a path outside ``/home/user`` (``/tmp``, ``/etc`` after ``sudo``, ``/opt``) is
served by the sandbox itself.

Those paths exist only in the sandbox's mount namespace (its ``/tmp`` is a tmpfs of its session, its system the
machine's overlays), so no host path can stand for them. Each operation on one runs the project's file agent
(:mod:`execspace.workspace.fileagent`, shipped as text) as a program of the sandbox's session: as ``user``, in its
view, under its filter and limits, one request on its stdin and one answer on its stdout. The agent can reach
exactly what the sandbox's programs reach, with their permissions, and nothing of the host; its rules hold there
too (every component opened from a directory fd without following a link: a path through a symbolic link is
refused). The home keeps its host path (:mod:`.paths`), which is faster.

Such a path is named here by its absolute SDK path (``/tmp/a``), a workspace path by its relative one
(``work/a``): :class:`SandboxView` takes either and sends each where it lives.
"""

from __future__ import annotations

import base64
import errno
import os
import posixpath
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from typing import Any

from ..errors import BackendError, LimitExceeded, PathDenied
from ..models import FileEntry, FileKind
from ..protocols import FileReader, SupportsFileMetadata, SupportsFileStreams
from ..workspace.agentprogram import MAX_ENTRIES, PIECE_BYTES, agent_answer, agent_program
from .paths import HOME, program_dir, to_sdk, to_view
from .sandboxes import Sandbox

__all__ = ["SandboxView", "outside_home"]

_KINDS = {"file": FileKind.FILE, "dir": FileKind.DIR, "symlink": FileKind.SYMLINK, "other": FileKind.OTHER}
_OS_ERRORS: dict[str, tuple[type[OSError], int]] = {
    "FileNotFoundError": (FileNotFoundError, errno.ENOENT),
    "FileExistsError": (FileExistsError, errno.EEXIST),
    "IsADirectoryError": (IsADirectoryError, errno.EISDIR),
    "NotADirectoryError": (NotADirectoryError, errno.ENOTDIR),
    "PermissionError": (PermissionError, errno.EACCES),
}


_ERRNOS = {os.strerror(number): number for number in errno.errorcode}


def outside_home(path: str) -> bool:
    """Whether a path of :class:`SandboxView` is outside the home (an absolute SDK path)."""
    return path.startswith("/")


class SandboxView:
    """The file operations the server's file API needs, over a sandbox's whole view (see the module): workspace
    paths on the engine's file API, absolute ones through the file agent in the sandbox."""

    def __init__(self, sandbox: Sandbox, streams: SupportsFileStreams | None = None) -> None:
        """``streams``: the workspace's file streams (:meth:`open_reader` and :meth:`write_stream` need them)."""
        self._sandbox = sandbox
        self._fs = sandbox.engine.fs
        self._given_streams = streams

    @property
    def _streams(self) -> SupportsFileStreams:
        assert self._given_streams is not None, "SandboxView(streams=...) reads and writes files of the home"
        return self._given_streams

    def path(self, sdk_path: str) -> str:
        """The path of ``sdk_path`` here (:func:`.paths.to_view`)."""
        return to_view(sdk_path, self._sandbox.whole_view)

    async def stat(self, path: str) -> FileEntry:
        if not outside_home(path):
            return await self._fs.stat(self._sandbox.workspace, path)
        if path == "/":
            return FileEntry("/", 0, 0.0, FileKind.DIR, 0o755)
        found = await self._agent("stat", path=_rel(path))
        return _entry(found[:6], found[6])

    async def exists(self, path: str) -> bool:
        if not outside_home(path):
            return await self._fs.exists(self._sandbox.workspace, path)
        try:
            await self.stat(path)
        except FileNotFoundError:
            return False
        return True

    async def list_dir(self, path: str, *, depth: int) -> list[FileEntry]:
        if not outside_home(path):
            return await self._fs.list_dir(self._sandbox.workspace, path, depth=depth)
        start = [] if path == "/" else _rel(path).split("/")
        found = await self._agent("list", start=start, descend=depth, max_entries=MAX_ENTRIES)
        return [_entry(e) for e in found]

    async def make_dir(self, path: str) -> None:
        if not outside_home(path):
            return await self._fs.make_dir(self._sandbox.workspace, path)
        await self._agent("make_dir", path=_rel(path))

    async def remove(self, path: str) -> None:
        if not outside_home(path):
            return await self._fs.remove(self._sandbox.workspace, path)
        await self._agent("remove_path", path=_rel(path))

    async def rename(self, src: str, dst: str) -> None:
        if not (outside_home(src) or outside_home(dst)):
            return await self._fs.rename(self._sandbox.workspace, src, dst)
        # one of them is outside: the agent moves both, the home's by its path in the sandbox
        await self._agent("rename", src=_rel(_absolute(src)), dst=_rel(_absolute(dst)))

    async def read_metadata(self, paths: Sequence[str]) -> list[dict[str, str]]:
        """Each path's file metadata (:class:`SupportsFileMetadata`): the home's from the engine's file API
        (none where it keeps none), the others' ``user.e2b.`` attributes read by the agent in one run."""
        found: dict[str, dict[str, str]] = {}
        home = [p for p in paths if not outside_home(p)]
        if home and isinstance(self._fs, SupportsFileMetadata):
            found.update(zip(home, await self._fs.read_metadata(self._sandbox.workspace, home), strict=True))
        elsewhere = [p for p in paths if outside_home(p) and p != "/"]
        if elsewhere:
            held = await self._agent("metadata", paths=[_rel(p) for p in elsewhere])
            found.update(zip(elsewhere, held, strict=True))
        return [found.get(p, {}) for p in paths]

    async def write_metadata(self, path: str, metadata: Mapping[str, str]) -> bool:
        """Make ``metadata`` the file's whole metadata; False where it keeps none. Outside the home the agent sets
        the attributes with the program's permissions, as ``setfattr`` in the sandbox would."""
        if outside_home(path):
            return bool(await self._agent("set_metadata", path=_rel(path), metadata=dict(metadata)))
        if not isinstance(self._fs, SupportsFileMetadata):
            return False
        return await self._fs.write_metadata(self._sandbox.workspace, path, metadata)

    async def open_reader(self, path: str) -> FileReader:
        if not outside_home(path):
            return await self._streams.open_reader(self._sandbox.workspace, path)
        (size,) = await self._agent("readable", paths=[_rel(path)])
        return _AgentReader(self, _rel(path), size)

    async def write_stream(self, path: str, chunks: AsyncIterable[bytes], *, max_bytes: int) -> int:
        if not outside_home(path):
            return await self._streams.write_stream(self._sandbox.workspace, path, chunks, max_bytes=max_bytes)
        rel, tmp, size, pending = _rel(path), None, 0, b""
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > max_bytes:
                    raise LimitExceeded(f"the file is larger than {max_bytes} bytes")
                pending += chunk
                while len(pending) >= PIECE_BYTES:
                    piece, pending = pending[:PIECE_BYTES], pending[PIECE_BYTES:]
                    tmp = await self._piece(rel, piece, tmp, final=False)
            await self._piece(rel, pending, tmp, final=True)
            tmp = None
        finally:
            if tmp is not None:  # a half-written temporary file goes (by the agent, as it was made)
                parent = posixpath.dirname(rel)
                await self._agent("remove_path", path=posixpath.join(parent, tmp) if parent else tmp)
        return size

    async def _piece(self, rel: str, data: bytes, tmp: str | None, *, final: bool) -> str | None:
        item = {"path": rel, "b64": base64.b64encode(data).decode(), "tmp": tmp, "final": final, "mode": 0o644}
        (made,) = await self._agent("write", items=[item])
        return str(made) if made is not None else None

    async def read_piece(self, rel: str, offset: int) -> dict[str, Any]:
        found: dict[str, Any] = await self._agent("read", path=rel, n=PIECE_BYTES, offset=offset)
        return found

    async def _agent(self, op: str, **args: object) -> Any:
        """One op of the file agent, run in the sandbox as its programs run; its refusals as the errors they
        name."""
        sandbox = self._sandbox
        spec = agent_program(op, args, env=sandbox.program_env(), cwd=program_dir(sandbox.workspace, HOME))
        result = await sandbox.engine.runner.run_program(sandbox.workspace, spec)
        answer = agent_answer(
            result,
            subject="outside /home/user",
            on="",
            fix="a template needs python3 for the file API outside /home/user",
        )
        if "error" in answer:
            raise _error(*answer["error"])
        return answer["ok"]


class _AgentReader:
    """A file outside the home read a piece at a time by the agent; a file that changed meanwhile ends it."""

    def __init__(self, view: SandboxView, rel: str, size: int) -> None:
        self._view, self._rel, self.size = view, rel, size
        self._closed = False

    async def chunks(self) -> AsyncIterator[bytes]:
        offset, identity = 0, None
        while offset < self.size and not self._closed:
            found = await self._view.read_piece(self._rel, offset)
            if identity is not None and found["id"] != identity:
                raise BackendError(f"/{self._rel} was replaced while it was read: read it again")
            identity = found["id"]
            data = base64.b64decode(found["b64"])[: self.size - offset]
            if not data:
                raise BackendError(f"/{self._rel} shrank while it was read: read it again")
            offset += len(data)
            yield data

    async def aclose(self) -> None:
        self._closed = True


def _rel(path: str) -> str:
    return path.lstrip("/")


def _absolute(path: str) -> str:
    """A path of :class:`SandboxView` as the sandbox's programs name it."""
    return path if outside_home(path) else to_sdk(path)


def _entry(found: list[Any], target: str | None = None) -> FileEntry:
    rel, size, mtime, kind, _links, mode = found
    return FileEntry("/" + rel, size, mtime, _KINDS.get(kind, FileKind.OTHER), mode, target)


def _error(kind: str, path: str, why: str) -> Exception:
    shown = "/" + path.lstrip("/") if path else path
    if kind == "PathDenied":
        return PathDenied(shown, why)
    if kind in _OS_ERRORS:
        cls, number = _OS_ERRORS[kind]
        return cls(number, why, shown)
    # another OSError: its errno by its message (EROFS, EXDEV…), so that OSError makes its own subclass
    return OSError(_ERRNOS.get(why, errno.EIO), why, shown)
