"""The file API beyond a sandbox's workspace: an absolute path as its programs see it (``/etc/hosts``, a directory of
``/usr``, a granted host tree) is served by the sandbox itself.

Such a path is what the sandbox shows there, with the permissions its programs have (a system directory read-only,
a grant as granted, a rootfs environment's own ``/etc``), which no host-side open can stand for: as root the host
would read ``/etc/shadow``. So each operation on one runs the project's file agent
(:mod:`execspace.workspace.fileagent`, shipped as text) as a program of the workspace: in its sandbox, as its
programs run (uid, view, seccomp filter, limits), with the network off, ``python3 -I -S``, one JSON request on its
stdin and one answer on its stdout (at most 2 MiB). It reaches exactly what the workspace's programs reach; its own
rules hold there too (every component opened from a directory fd without following a link: a path through a
symbolic link is refused; only regular files with one link are read). The workspace and its program binds
(``/tmp`` is the workspace's ``tmp/``) keep their host paths, which is faster.
"""

from __future__ import annotations

import base64
import errno
import os
import posixpath
from collections.abc import Sequence
from typing import Any

from ...errors import BackendError, PathDenied, PathIsDirectory, UsageError
from ...mime import SNIFF_BYTES, guess_mime
from ...models import File, FileEntry, FileKind, PutFile, Workspace
from ...protocols import ProgramRunner
from ...workspace.agentprogram import MAX_ENTRIES, PIECE_BYTES, agent_answer, agent_program

__all__ = ["ProgramFiles"]

_KINDS = {"file": FileKind.FILE, "dir": FileKind.DIR, "symlink": FileKind.SYMLINK, "other": FileKind.OTHER}
#: The agent's refusals that mean "not for the program": a rule, a mode bit, a read-only filesystem.
_DENIED = {"PathDenied", "PermissionError"}
_DENIED_ERRNOS = {os.strerror(e) for e in (errno.EACCES, errno.EPERM, errno.EROFS)}
_ERRNOS = {os.strerror(number): number for number in errno.errorcode}


class ProgramFiles:
    """The file operations at absolute paths outside a workspace (and its program binds), run by the file agent
    in the workspace's sandbox (see the module). :attr:`runner` is the engine's, set once it is built.

    ``host_paths``: the host paths the policy names (grants, denials), which the sandbox mounts where they are, over
    a program bind that holds them (``/tmp``): a path under one is the view's."""

    def __init__(self, host_paths: Sequence[str] = ()) -> None:
        self.runner: ProgramRunner | None = None
        self._host_paths = tuple(p for p in host_paths if p.startswith("/"))

    def shows(self, path: str) -> bool:
        p = posixpath.normpath(path)
        return path.startswith("/") and any(p == h or p.startswith(h.rstrip("/") + "/") for h in self._host_paths)

    async def read_file(self, ws: Workspace, path: str, *, max_bytes: int | None = None) -> File:
        (size,) = await self._agent(ws, path, "readable", paths=[_rel(path)])
        want = size if max_bytes is None else min(size, max_bytes)
        data, identity = b"", None
        while len(data) < want:
            n = min(PIECE_BYTES, want - len(data))
            found = await self._agent(ws, path, "read", path=_rel(path), n=n, offset=len(data))
            if identity is not None and found["id"] != identity:
                raise BackendError(f"{path} was replaced while it was read: read it again")
            identity = found["id"]
            piece = base64.b64decode(found["b64"])
            if not piece:
                break  # it shrank meanwhile: what there was
            data += piece
        return File(path, data, guess_mime(path, data[:SNIFF_BYTES]), size, truncated=len(data) < size)

    async def put_files(self, ws: Workspace, files: Sequence[PutFile]) -> None:
        for f in files:
            data, tmp = f.data, None
            while True:
                piece, data = data[:PIECE_BYTES], data[PIECE_BYTES:]
                item = {"path": _rel(f.path), "b64": base64.b64encode(piece).decode(), "tmp": tmp, "mode": f.mode}
                (tmp,) = await self._agent(ws, f.path, "write", items=[{**item, "final": not data}])
                if not data:
                    break

    async def stat(self, ws: Workspace, path: str) -> FileEntry:
        if path.rstrip("/") == "":
            return FileEntry("/", 0, 0.0, FileKind.DIR, 0o755)
        found = await self._agent(ws, path, "stat", path=_rel(path))
        return _entry(found[:6], found[6])

    async def list_dir(self, ws: Workspace, path: str, *, depth: int = 1) -> list[FileEntry]:
        rel = _rel(path)
        start = rel.split("/") if rel else []
        found = await self._agent(ws, path, "list", start=start, descend=depth, max_entries=MAX_ENTRIES)
        return [_entry(e) for e in found]

    async def make_dir(self, ws: Workspace, path: str) -> None:
        await self._agent(ws, path, "make_dir", path=_rel(path))

    async def remove(self, ws: Workspace, path: str) -> None:
        await self._agent(ws, path, "remove_path", path=_rel(path))

    async def _agent(self, ws: Workspace, path: str, op: str, /, **args: object) -> Any:
        """One op of the file agent, run in the workspace's sandbox, for ``path`` (as the caller named it); its
        refusals as the errors they name."""
        if self.runner is None:
            raise UsageError("this engine's programs do not run yet: paths outside the workspace need them")
        result = await self.runner.run_program(ws, agent_program(op, args))
        answer = agent_answer(
            result,
            subject=f"for {path}",
            on=f" on {path}",
            fix="paths outside the workspace need a python3 in the sandbox",
        )
        if "error" in answer:
            raise _error(path, *answer["error"])
        return answer["ok"]


def _rel(path: str) -> str:
    return path.strip("/")


def _entry(found: list[Any], target: str | None = None) -> FileEntry:
    rel, size, mtime, kind, _links, mode = found
    return FileEntry("/" + rel, size, mtime, _KINDS.get(kind, FileKind.OTHER), mode, target)


def _error(path: str, kind: str, _where: str, why: str) -> Exception:
    """The agent's refusal at ``path`` (as the caller named it) as execspace raises it on a workspace path."""
    seen = f"{why} (as the sandbox's programs see {path})"
    if kind == "IsADirectoryError":
        return PathIsDirectory(path, f"it is a directory, not a file (as the sandbox's programs see {path})")
    if kind in _DENIED or why in _DENIED_ERRNOS:
        return PathDenied(path, seen)
    if kind == "FileNotFoundError":
        return FileNotFoundError(
            errno.ENOENT, f"no such file or directory (as the sandbox's programs see {path})", path
        )
    return OSError(_ERRNOS.get(why, errno.EIO), seen, path)
