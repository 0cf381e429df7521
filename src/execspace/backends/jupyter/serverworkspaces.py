"""Server-side workspaces (``ServerKernels(shared_filesystem=False)``): files move through a kernel.

Workspaces are directories under a root on the server's side (``remote_root``, relative to the kernels'
start directory unless absolute), with the standard layout. A **file kernel**, one per engine, runs the
fixed program :mod:`execspace.workspace.fileagent` (its text after that of
:mod:`execspace.workspace.confinecore`, with the request as a JSON string literal) for every file operation:
creating and removing workspaces, writing, reading and walking files with the rules of the core (fd-relative
walks with ``O_NOFOLLOW``, regular singly linked files only, temp file then rename). Bytes cross base64-encoded
in chunks of :data:`CHUNK` bytes, so no message is large.

Why a file kernel of its own rather than each workspace's kernel: a workspace's kernel is busy while a cell
runs (up to its timeout), and file calls (collecting outputs, saving a cell's plots) must not wait for it,
nor may user code be interrupted or shadowed by them. The file kernel runs as the same server user as the
workspaces' kernels: the file API trusts the server side (the same principal as the code it runs), and
everything it returns is data that is checked here before it touches this host (paths re-validated, sizes
capped, artifact names validated by the stager).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import posixpath
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wcmatch import glob as wglob

from ...audit import AuditSink
from ...errors import (
    BackendError,
    PathDenied,
    PathIsDirectory,
    SetupFailed,
    UnsupportedBackend,
    WorkspaceFileNotFound,
    WorkspaceNotFound,
)
from ...mime import SNIFF_BYTES, guess_mime
from ...models import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_FILES,
    DEFAULT_MAX_TOTAL_BYTES,
    File,
    FileEntry,
    FileKind,
    Persistence,
    PutFile,
    Workspace,
    WorkspacePolicy,
)
from ...tracing import NO_TRACER, Tracer
from ...workspace.confine import split_relpath
from ...workspace.fileagent import MIME, agent_text
from ...workspace.hostfs import GLOB_FLAGS, collect_globs, walk_starts
from ...workspace.layout import LAYOUT_DIRS, METADATA_FILE, sanitize_id, workspace_env
from ...workspace.metadata import WorkspaceMetadata, is_metadata_temp
from ...workspace.programpaths import checked_relative, workspace_relatives
from ...workspace.staging import WorkspaceFSBase, read_within_caps
from .kernels import bind
from .serverkernels import RemoteConnection, RemoteKernelSessions, RemoteLauncher

if TYPE_CHECKING:
    from ...artifacts import ArtifactService
    from ...envpolicy import EnvPolicy
    from .serverapi import ServerApi

__all__ = [
    "CHUNK",
    "FileKernel",
    "RemoteWorkspaceFS",
    "RemoteWorkspaceManager",
    "ServerWorkspaceKernels",
    "ServerWorkspaceLauncher",
]

#: Raw bytes per file call (base64 makes the message a third larger).
CHUNK = 1 << 20
#: Most entries one walk lists (like ConfinedRoot.walk's budget).
MAX_WALK_ENTRIES = 200_000
#: What a missing workspace or file is on our side (``WorkspaceGone``: the workspace's directory is missing).
_NOT_FOUND = ("FileNotFoundError", "WorkspaceGone")


def agent_code(source: str, op: str, args: dict[str, Any]) -> str:
    """The cell for one call: the fixed text, run in fresh globals (no package, so its execspace imports fall
    back to the shipped text) with the request as a string literal."""
    request = json.dumps({"op": op, "args": args})
    globs = f"{{'__name__': '__execspace_remotefs__', '__package__': '', '_ARGS': {request!r}}}"
    return f"exec({source!r}, {globs})"


class FileKernel:
    """The engine's file kernel on the server: one call at a time, replaced if it dies or hangs."""

    def __init__(self, launcher: RemoteLauncher, *, timeout: float) -> None:
        self._launcher = launcher
        self._timeout = timeout
        self._source = agent_text()
        self._lock = asyncio.Lock()
        self._kernel: RemoteConnection | None = None

    async def call(self, op: str, args: dict[str, Any]) -> Any:
        """Run ``op`` in the file kernel; its result, or the execspace error its rules raised."""
        async with self._lock:
            if self._kernel is None or self._kernel.gone is not None:
                await self._drop()
                self._kernel = await self._launcher.start_unbound(self._timeout)
            try:
                result = await self._run(self._kernel, agent_code(self._source, op, args))
            except BackendError:
                await self._drop()
                raise
        if "error" in result:
            kind, path, why = (str(x) for x in result["error"])
            if kind == "PathDenied":
                raise PathDenied(path, why)
            if kind == "IsADirectoryError":
                raise PathIsDirectory(path, f"{why} (on the server)")
            if kind in _NOT_FOUND:
                raise FileNotFoundError(f"{why}: {path!r} (on the server)")
            raise OSError(f"{kind}: {why}: {path!r} (on the server)")
        return result["ok"]

    async def _run(self, kernel: RemoteConnection, code: str) -> dict[str, Any]:
        await kernel.drain()
        content = {"code": code, "silent": True, "store_history": False, "user_expressions": {}}
        msg_id = kernel.send("execute_request", {**content, "allow_stdin": False, "stop_on_error": False})
        deadline = time.monotonic() + self._timeout
        result: dict[str, Any] | None = None
        while (remaining := deadline - time.monotonic()) > 0:
            msg = await kernel.next_iopub(remaining)
            if msg is None:
                break
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, body = msg["header"]["msg_type"], msg.get("content", {})
            if kind == "display_data" and isinstance(body.get("data", {}).get(MIME), dict):
                result = body["data"][MIME]
            elif kind == "error":
                raise BackendError(f"the server's file kernel failed: {body.get('ename')}: {body.get('evalue')}")
            elif kind == "status" and body.get("execution_state") == "idle":
                if result is None:
                    raise BackendError("the server's file kernel gave no result")
                return result
        raise BackendError(f"the server's file kernel did not answer within {self._timeout:g}s ({kernel.gone or ''})")

    async def _drop(self) -> None:
        kernel, self._kernel = self._kernel, None
        if kernel is not None:
            await kernel.stop(wait=False)

    async def aclose(self) -> None:
        async with self._lock:
            await self._drop()


class RemoteWorkspaceFS(WorkspaceFSBase):
    """WorkspaceFS for workspaces on the server: same paths rules, caps and errors as HostWorkspaceFS.

    Staging, ``exists`` and ``stage_directory`` (host trees uploaded with ``put_files``) come from the base.
    """

    def __init__(
        self,
        files: FileKernel,
        artifacts: ArtifactService | None = None,
        host_roots: Sequence[Path | str] = (),
        audit: AuditSink | None = None,
        tracer: Tracer = NO_TRACER,
    ) -> None:
        super().__init__(artifacts, host_roots, tracer=tracer, audit=audit)
        self.files = files

    async def put_files(self, ws: Workspace, files: Sequence[PutFile]) -> None:
        files = [replace(f, path=checked_relative(ws, f.path)) for f in files]  # refused before anything is written
        batch: list[dict[str, Any]] = []
        size = 0
        for f in files:
            data = f.data
            if size + len(data) > CHUNK and batch:
                await self.files.call("write", {"ws": ws.path, "items": batch})
                batch, size = [], 0
            if len(data) <= CHUNK:
                batch.append(_piece(f.path, data, f.mode, None, final=True))
                size += len(data)
            else:
                await self._put_large(ws, f.path, data, f.mode)
        if batch:
            await self.files.call("write", {"ws": ws.path, "items": batch})
        self._wrote(ws, [(f.path, len(f.data)) for f in files])

    async def _put_large(self, ws: Workspace, path: str, data: bytes, mode: int) -> None:
        tmp: str | None = None
        for start in range(0, len(data), CHUNK):
            final = start + CHUNK >= len(data)
            item = _piece(path, data[start : start + CHUNK], mode, tmp, final=final)
            (tmp,) = await self.files.call("write", {"ws": ws.path, "items": [item]})

    async def read_file(self, ws: Workspace, path: str, *, max_bytes: int | None = None) -> File:
        path = checked_relative(ws, path)
        try:
            data, size = await self._read(ws, path, max_bytes)
        except FileNotFoundError:
            raise WorkspaceFileNotFound(path, f"{ws.id!r} ({ws.path} on the server)") from None
        return File(path, data, guess_mime(path, data[:SNIFF_BYTES]), size, truncated=len(data) < size)

    async def _read(self, ws: Workspace, path: str, cap: int | None) -> tuple[bytes, int]:
        """Up to ``cap`` bytes of the file, chunk by chunk, and its size; the file must stay the same file."""
        chunks: list[bytes] = []
        got, ident = 0, None
        while True:
            want = CHUNK if cap is None else min(CHUNK, cap - got)
            reply = await self.files.call("read", {"ws": ws.path, "path": path, "offset": got, "n": max(want, 0)})
            if ident is not None and reply["id"] != ident:
                raise BackendError(f"{path!r} was replaced on the server while being read")
            ident, size = reply["id"], int(reply["size"])
            chunk = base64.b64decode(reply["b64"])
            chunks.append(chunk)
            got += len(chunk)
            if not chunk or got >= size or (cap is not None and got >= cap):
                return b"".join(chunks)[: cap if cap is not None else None], size

    async def collect(
        self,
        ws: Workspace,
        patterns: Sequence[str],
        *,
        max_files: int = DEFAULT_MAX_FILES,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    ) -> list[File]:
        found = await self._matching(ws, collect_globs(workspace_relatives(ws, patterns)))

        async def read(path: str, cap: int) -> tuple[bytes, int]:
            return await self._read(ws, path, cap)

        return await read_within_caps(
            ((path, kind, nlink) for path, _size, _mtime, kind, nlink in found),
            read,
            max_files=max_files,
            max_file_bytes=max_file_bytes,
            max_total_bytes=max_total_bytes,
        )

    async def _matching(self, ws: Workspace, globs: list[str]) -> list[_Found]:
        starts = walk_starts(globs)
        if not starts:
            return []
        found = await self.files.call("walk", {"ws": ws.path, "starts": starts, "max_entries": MAX_WALK_ENTRIES})
        return list(_selected(found, globs))

    async def list(self, ws: Workspace, patterns: Sequence[str]) -> list[FileEntry]:
        """Every entry matching the globs, of any kind (see HostWorkspaceFS.list); no content read."""
        found = await self._matching(ws, collect_globs(workspace_relatives(ws, patterns)))
        return [FileEntry(path, size, mtime, kind) for path, size, mtime, kind, _ in found]

    async def stat(self, ws: Workspace, path: str) -> FileEntry:
        rel = checked_relative(ws, path)
        (path, size, mtime, kind, _) = _checked(await self.files.call("stat", {"ws": ws.path, "path": rel}))
        return FileEntry(path, size, mtime, kind)

    async def remove(self, ws: Workspace, path: str) -> None:
        rel = checked_relative(ws, path)
        await self.files.call("remove_path", {"ws": ws.path, "path": rel})
        self._removed(ws, rel)

    async def make_dir(self, ws: Workspace, path: str) -> None:
        rel = checked_relative(ws, path)
        await self.files.call("make_dir", {"ws": ws.path, "path": rel})

    async def rename(self, ws: Workspace, src: str, dst: str) -> None:
        src, dst = checked_relative(ws, src), checked_relative(ws, dst)
        await self.files.call("rename", {"ws": ws.path, "src": src, "dst": dst})
        self._renamed(ws, src, dst)

    async def next_cell(self, ws: Workspace) -> int:
        return int(await self.files.call("next_cell", {"ws": ws.path}))


def _piece(path: str, data: bytes, mode: int, tmp: str | None, *, final: bool) -> dict[str, Any]:
    return {"path": path, "b64": base64.b64encode(data).decode(), "mode": mode, "tmp": tmp, "final": final}


#: One walk entry from the server, checked: path, size, mtime, kind, hard links.
_Found = tuple[str, int, float, FileKind, int]


def _checked(raw: Any) -> _Found:
    """A walk or stat entry from the server, its path re-validated (whoever sent it) and its fields typed."""
    path, size, mtime, kind, nlink = raw[:5]
    split_relpath(str(path))  # a path that could leave the workspace is refused
    return str(path), int(size), float(mtime), FileKind(kind), int(nlink)


def _selected(found: Any, globs: list[str]) -> Iterator[_Found]:
    """The walk's entries that match the globs; the server's answer is checked before it is used."""
    seen: set[str] = set()
    for raw in found:
        entry = _checked(raw)
        path = entry[0]
        if path in seen or ("/" not in path and is_metadata_temp(path)):
            continue
        if wglob.globmatch(path, globs, flags=GLOB_FLAGS):
            seen.add(path)
            yield entry


class ServerWorkspaceLauncher(RemoteLauncher):
    """Starts a workspace's kernel and moves it into the workspace on the server."""

    def __init__(self, api: ServerApi, env_policy: EnvPolicy | None, *, kernel_name: str) -> None:
        super().__init__(api, env_policy, kernel_name=kernel_name, server_root=None)
        self.fs: RemoteWorkspaceFS | None = None

    async def start(self, ws: Workspace, *, timeout: float) -> RemoteConnection:  # noqa: ASYNC109
        assert self.fs is not None
        run_dir = f"runs/kernel-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"
        await self.fs.files.call("layout", _layout_args(ws, [run_dir]))
        env = self._env_policy.build(os.environ, {}, workspace_env(ws.path, run_dir))
        kernel = await self.start_unbound(timeout)
        try:
            content = await bind(kernel, posixpath.join(ws.path, "work"), env, timeout)
            if content.get("status") != "ok":
                why = f"{content.get('ename')}: {content.get('evalue')}" if content else kernel.gone or "no reply"
                raise SetupFailed("jupyter", f"kernel {self.kernel_name!r} could not be moved into {ws.path}: {why}")
        except BaseException:
            await kernel.stop(wait=False)
            raise
        return kernel


def _layout_args(ws: Workspace, extra: list[str]) -> dict[str, Any]:
    record = WorkspaceMetadata(id=ws.id).to_json()
    data = record if isinstance(record, bytes) else record.encode()
    return {
        "ws": ws.path,
        "dirs": [*LAYOUT_DIRS, *extra],
        "record": METADATA_FILE,
        "data": base64.b64encode(data).decode(),
    }


class ServerWorkspaceKernels(RemoteKernelSessions):
    """Remote kernels whose workspaces exist only on the server (no host path)."""

    def __init__(
        self, api: ServerApi, fs: RemoteWorkspaceFS, launcher: ServerWorkspaceLauncher, **options: Any
    ) -> None:
        super().__init__(api, fs, launcher=launcher, **options)
        self._server_fs = fs

    async def next_cell_number(self, ws: Workspace) -> int:
        return await self._server_fs.next_cell(ws)


class RemoteWorkspaceManager:
    """Workspaces under ``remote_root`` on the server, created and removed by the file kernel."""

    def __init__(
        self, files: FileKernel, kernels: ServerWorkspaceKernels, remote_root: str, audit: AuditSink | None = None
    ) -> None:
        self.audit = audit
        """Where a line of each creation and clean-up goes."""
        self._files = files
        self._kernels = kernels
        self._remote_root = remote_root
        self._root: str | None = None
        self._known: dict[str, Workspace] = {}

    async def root(self) -> str:
        """The workspace root's absolute path on the server (made on first use, private to the server's user)."""
        if self._root is None:
            root = await self._files.call("root", {"root": self._remote_root})
            if not isinstance(root, str) or not posixpath.isabs(root):
                raise BackendError(f"the server's file kernel named {root!r} as the workspace root")
            self._root = root
        return self._root

    async def create_workspace(
        self, exec_id: str, policy: WorkspacePolicy | None = None, *, path: Path | None = None
    ) -> Workspace:
        if path is not None:
            raise UnsupportedBackend("path= names a host directory; this server does not share our filesystem")
        policy = policy or WorkspacePolicy()
        session = policy.persistence is Persistence.SESSION
        if session and exec_id in self._known:
            return self._known[exec_id]
        name = sanitize_id(exec_id) if session else f"{sanitize_id(exec_id)}-{secrets.token_hex(4)}"
        ws = Workspace(id=exec_id, path=posixpath.join(await self.root(), name), backend="jupyter", policy=policy)
        await self._files.call("layout", _layout_args(ws, []))
        if session:
            self._known[exec_id] = ws
        self._record("workspace.create", ws)
        return ws

    def _record(self, event: str, ws: Workspace) -> None:
        if self.audit is not None:
            self.audit.record(event, {"workspace": ws.id, "backend": "jupyter"})

    async def get_workspace(self, exec_id: str) -> Workspace:
        if exec_id in self._known:
            return self._known[exec_id]
        ws = Workspace(id=exec_id, path=posixpath.join(await self.root(), sanitize_id(exec_id)), backend="jupyter")
        with contextlib.suppress(FileNotFoundError):
            if await self._files.call("exists", {"ws": ws.path, "record": METADATA_FILE}):
                self._known[exec_id] = ws
                return ws
        raise WorkspaceNotFound(f"no workspace for id {exec_id!r} on the server; create it with create_workspace()")

    async def cleanup(self, ws: Workspace) -> None:
        if posixpath.dirname(ws.path) != await self.root() or ws.backend != "jupyter":
            raise PathDenied(ws.path, "not a workspace of this engine's root on the server")
        if self._known.get(ws.id) == ws:
            del self._known[ws.id]
        await self._kernels.shutdown(ws)
        await self._files.call("remove", {"ws": ws.path})
        self._record("workspace.cleanup", ws)
