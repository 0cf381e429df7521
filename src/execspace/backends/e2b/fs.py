"""Workspaces in E2B sandboxes: a directory with the standard layout in the sandbox, files over the SDK.

Content moves through the SDK's files API (``/files``: binary-safe, never base64 through a cell or a command).
Every path is checked where it is, in the sandbox, by the file agent (:mod:`execspace.workspace.fileagent`):
components opened from directory fds with ``O_NOFOLLOW``, so a symlink a program planted is refused, never
followed. Writes are uploaded to a private staging directory and then moved into place by the agent (a planted
link is replaced, not written through). Reads are checked by the agent, then fetched: a program racing that check
can only make us read a file of its own sandbox, which it could read anyway (the sandbox, not the workspace, is
the boundary here).
"""

from __future__ import annotations

import builtins
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ...audit import AuditSink, AuditValue
from ...errors import WorkspaceFileNotFound
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
    Snapshot,
    Workspace,
    WorkspacePolicy,
)
from ...tracing import (
    NO_TRACER,
    WORKSPACE_CLEANUP,
    WORKSPACE_CREATE,
    WORKSPACE_FORK,
    WORKSPACE_RESTORE,
    WORKSPACE_SNAPSHOT,
    AttributeValue,
    Tracer,
)
from ...workspace.hostfs import GLOB_FLAGS, collect_globs, walk_starts
from ...workspace.layout import LAYOUT_DIRS
from ...workspace.metadata import is_metadata_temp
from ...workspace.programpaths import checked_relative, workspace_relatives
from ...workspace.staging import WorkspaceFSBase, read_within_caps
from .branches import E2BBranches
from .sandboxes import Box, Sandboxes, workspace_key

if TYPE_CHECKING:
    from ...artifacts import ArtifactService
    from ...process.warmpool import WarmPool

__all__ = ["E2BWorkspaceFS", "E2BWorkspaceManager"]

#: Files per upload request: services cap the parts of one multipart body (``execspace serve``: 1,000).
_UPLOAD_BATCH = 500
_KINDS = {"file": FileKind.FILE, "dir": FileKind.DIR, "symlink": FileKind.SYMLINK, "other": FileKind.OTHER}


class E2BWorkspaceManager:
    """One workspace per id, in the sandbox the persistence option gives it. Snapshots and forks (see
    :mod:`.branches`) where the service keeps files-only snapshots (``execspace serve``); elsewhere they raise
    ``CapabilityError``."""

    def __init__(
        self,
        boxes: Sandboxes,
        stop_kernels: Callable[[Workspace], Awaitable[None]] | None = None,
        tracer: Tracer = NO_TRACER,
        audit: AuditSink | None = None,
    ) -> None:
        self._boxes = boxes
        self.tracer = tracer
        """A span of each creation and clean-up."""
        self.audit = audit
        """Where a line of each creation and clean-up goes (with the sandbox's id)."""
        self.branches = E2BBranches(boxes, tracer)
        # a workspace's kernels run in its sandbox's code interpreter: where the sandbox stays, cleanup ends them
        self._stop_kernels = stop_kernels

    @property
    def pool(self) -> WarmPool[Box] | None:
        """The sandboxes made ahead (``pool_size``), or None: ``await pool.ready()`` waits for the fill."""
        return self._boxes.pool

    async def create_workspace(
        self, exec_id: str, policy: WorkspacePolicy | None = None, *, path: Path | None = None
    ) -> Workspace:
        if path is not None:
            from ...errors import UnsupportedBackend

            raise UnsupportedBackend("the e2b backend has no host paths: its workspaces live in remote sandboxes")
        with self.tracer.span(WORKSPACE_CREATE, _attributes(exec_id)):
            ws = await self._create(exec_id, policy)
        self._record("workspace.create", ws)
        return ws

    def _record(self, event: str, ws: Workspace) -> None:
        if self.audit is not None:
            sandbox = self._boxes.box(workspace_key(ws.id)).id
            self.audit.record(event, {"workspace": ws.id, "backend": "e2b", "sandbox": sandbox})

    async def _create(self, exec_id: str, policy: WorkspacePolicy | None) -> Workspace:
        key = workspace_key(exec_id)
        box = await self._boxes.for_workspace(key)
        root = box.root_of(key)
        await box.agent("layout", ws=root, dirs=list(LAYOUT_DIRS))
        policy = policy or WorkspacePolicy()
        if self._boxes.options.persistence == "turn":  # a fresh sandbox for each creation, whatever was asked
            policy = replace(policy, persistence=Persistence.TURN)
        return Workspace(id=exec_id, path=root, backend="e2b", policy=policy)

    async def get_workspace(self, exec_id: str) -> Workspace:
        key = workspace_key(exec_id)
        box = await self._boxes.for_workspace(key, create=False)
        root = box.root_of(key)
        await box.agent("stat", ws=root, path="work")
        return Workspace(id=exec_id, path=root, backend="e2b")

    async def cleanup(self, ws: Workspace) -> None:
        with self.tracer.span(WORKSPACE_CLEANUP, _attributes(ws.id)):
            sandbox = await self._cleanup(ws)
        if self.audit is not None:  # as on a host, a workspace gone already too (its sandbox: null)
            self.audit.record("workspace.cleanup", {"workspace": ws.id, "backend": "e2b", "sandbox": sandbox})

    async def _cleanup(self, ws: Workspace) -> str | None:
        """Remove the workspace; the id of the sandbox it was in (None: it was gone already)."""
        key = workspace_key(ws.id)
        try:
            box = self._boxes.box(key)
        except LookupError:
            return None
        if box.owned:
            await self._boxes.forget(key)  # its own sandbox: killing it stops its programs and removes everything
            await self._end_kernels(ws)  # (only forgotten here: nothing is left to ask)
            return box.id
        await self._end_kernels(ws)  # a shared sandbox stays: this workspace's kernels in it must not
        await box.call("removing a workspace", box.sandbox.commands.run(f"rm -rf -- '{ws.path}'"))
        await self._boxes.forget(key)
        return box.id

    async def _end_kernels(self, ws: Workspace) -> None:
        if self._stop_kernels is not None:
            await self._stop_kernels(ws)

    # -- pause: the whole sandbox, its processes and kernels included -----------------------------------

    async def pause(self, ws: Workspace) -> None:
        """Pause the workspace's sandbox where the service pauses sandboxes (E2B cloud keeps its memory and
        files; ``execspace serve`` keeps it stopped in its memory): its programs and kernels stop where they are,
        and its timeout with them. The next call on the workspace, :meth:`resume`, or per session the next
        engine's ``get_workspace`` resumes it.

        Raises:
            CapabilityError: the service does not pause (detected at the first pause, then not asked again),
                or the sandbox is shared (``sandbox_id``).
        """
        await self._boxes.pause(workspace_key(ws.id))

    async def resume(self, ws: Workspace) -> None:
        """Resume the workspace's paused sandbox now (a no-op when it runs)."""
        await self._boxes.resume(workspace_key(ws.id))

    # -- snapshots and forks: the sandbox's files, never its processes or kernels ------------------------

    async def fork_mode(self) -> Literal["cow", "copy"]:
        """How the service forks (its own copy-on-write or copies); ``CapabilityError`` where it cannot."""
        return await self.branches.mode()

    async def snapshot(self, ws: Workspace, name: str | None = None) -> Snapshot:
        """Freeze the workspace's files (its sandbox's, taken by the service with its programs stopped)."""
        with self.tracer.span(WORKSPACE_SNAPSHOT, _attributes(ws.id)) as span:
            snap = await self.branches.snapshot(ws, name)
            span.set("execspace.snapshot.id", snap.id)
            return snap

    async def fork(
        self,
        source: Workspace | Snapshot | str,
        count: int = 1,
        ids: Sequence[str] | None = None,
        *,
        policy: WorkspacePolicy | None = None,
    ) -> builtins.list[Workspace]:
        """``count`` new workspaces (1..100), each in a new sandbox starting with the files of ``source`` (a
        workspace now, or a snapshot: its handle, id or name); ``ids`` names them. All or none."""
        forked: dict[str, AttributeValue] = {
            "execspace.fork.source": source.id if isinstance(source, Workspace | Snapshot) else source,
            "execspace.fork.count": max(count, len(ids or ())),
        }
        with self.tracer.span(WORKSPACE_FORK, _attributes(None, forked)):
            return await self.branches.fork(source, count, ids, policy)

    async def restore(self, ws: Workspace, snapshot: Snapshot | str) -> None:
        """Give the workspace a new sandbox made from ``snapshot``; the old one and its programs are killed."""
        with self.tracer.span(WORKSPACE_RESTORE, _attributes(ws.id)):
            await self.branches.restore(ws, snapshot)

    async def list_snapshots(self) -> builtins.list[Snapshot]:
        """The service's snapshots (those taken elsewhere with only their id and name known)."""
        return await self.branches.list()

    async def get_snapshot(self, key: str) -> Snapshot:
        return await self.branches.get(key)

    async def remove_snapshot(self, snapshot: Snapshot | str) -> None:
        await self.branches.remove(snapshot)


def _attributes(workspace: str | None, more: dict[str, AttributeValue] | None = None) -> dict[str, AttributeValue]:
    """A workspace span's attributes, as the host backends' (``HostWorkspaceManager``) have them."""
    found: dict[str, AttributeValue] = {"execspace.backend": "e2b", **(more or {})}
    if workspace is not None:
        found["execspace.workspace.id"] = workspace
    return found


class E2BWorkspaceFS(WorkspaceFSBase):
    """The file primitives over the SDK's files API, every path checked in the sandbox."""

    def __init__(
        self,
        boxes: Sandboxes,
        artifacts: ArtifactService | None = None,
        host_roots: Sequence[Path | str] = (),
        tracer: Tracer = NO_TRACER,
        audit: AuditSink | None = None,
    ) -> None:
        super().__init__(artifacts, host_roots, tracer=tracer, audit=audit)
        self._boxes = boxes

    def _box(self, ws: Workspace) -> Box:
        return self._boxes.box(workspace_key(ws.id))

    def audit_fields(self, ws: Workspace) -> dict[str, AuditValue]:
        return {"workspace": ws.id, "sandbox": self._box(ws).id}

    async def put_files(self, ws: Workspace, files: Sequence[PutFile]) -> None:
        if not files:
            return
        plan = [(checked_relative(ws, f.path), f) for f in files]  # refuses escapes before any upload
        box = self._box(ws)
        stage = f"{box.stage_dir()}/{secrets.token_hex(8)}"
        from e2b.sandbox.filesystem.filesystem import WriteEntry

        entries = []
        moves = []
        for i, (dest, f) in enumerate(plan):
            data = f.content.encode() if isinstance(f.content, str) else f.content
            entries.append(WriteEntry(path=box.sdk_path(f"{stage}/{i}"), data=data))
            moves.append([str(i), dest, f.mode])
        for at in range(0, len(entries), _UPLOAD_BATCH):
            await box.call("uploading files", box.sandbox.files.write_files(entries[at : at + _UPLOAD_BATCH]))
        await box.agent("install", ws=ws.path, stage=stage, files=moves)
        self._wrote(ws, [(dest, len(f.data)) for dest, f in plan])

    async def read_file(self, ws: Workspace, path: str, *, max_bytes: int | None = None) -> File:
        rel = checked_relative(ws, path)
        try:
            data, size = await self._read(ws, rel, max_bytes)
        except FileNotFoundError:
            raise WorkspaceFileNotFound(rel, f"{ws.id!r} ({ws.path} in its sandbox)") from None
        return File(rel, data, guess_mime(rel, data[:SNIFF_BYTES]), size, truncated=len(data) < size)

    async def _read(self, ws: Workspace, rel: str, cap: int | None) -> tuple[bytes, int]:
        """The first ``cap`` bytes of ``rel`` (checked in the sandbox first) and its size."""
        box = self._box(ws)
        (size,) = await box.agent("readable", ws=ws.path, paths=[rel])
        data = await self._fetch(box, ws, rel)
        return data[:cap] if cap is not None else data, max(size, len(data))

    async def _fetch(self, box: Box, ws: Workspace, rel: str) -> bytes:
        content = await box.call(
            f"reading {rel}", box.sandbox.files.read(box.sdk_path(f"{ws.path}/{rel}"), format="bytes")
        )
        return bytes(content)

    async def _entries(self, ws: Workspace, patterns: Sequence[str]) -> builtins.list[tuple[FileEntry, int]]:
        from wcmatch import glob as wglob

        globs = collect_globs(workspace_relatives(ws, patterns))
        if not globs:
            return []
        starts = [list(s) for s in walk_starts(globs)]
        listed = await self._box(ws).agent("walk", ws=ws.path, starts=starts)
        out: builtins.list[tuple[FileEntry, int]] = []
        seen: set[str] = set()
        for rel, size, mtime, kind, nlink, mode in listed:
            if rel in seen or ("/" not in rel and is_metadata_temp(rel)):
                continue
            if wglob.globmatch(rel, globs, flags=GLOB_FLAGS):
                seen.add(rel)
                out.append((FileEntry(rel, size, mtime, _KINDS[kind], mode), nlink))
        return out

    async def list(self, ws: Workspace, patterns: Sequence[str]) -> list[FileEntry]:
        return [e for e, _ in await self._entries(ws, patterns)]

    async def collect(
        self,
        ws: Workspace,
        patterns: Sequence[str],
        *,
        max_files: int = DEFAULT_MAX_FILES,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    ) -> builtins.list[File]:
        found = await self._entries(ws, patterns)

        async def read(path: str, cap: int) -> tuple[bytes, int]:
            return await self._read(ws, path, cap)

        return await read_within_caps(
            ((entry.path, entry.kind, nlink) for entry, nlink in found),
            read,
            max_files=max_files,
            max_file_bytes=max_file_bytes,
            max_total_bytes=max_total_bytes,
        )

    async def stat(self, ws: Workspace, path: str) -> FileEntry:
        rel = checked_relative(ws, path)
        got, size, mtime, kind, _, mode, target = await self._box(ws).agent("stat", ws=ws.path, path=rel)
        return FileEntry(got, size, mtime, _KINDS[kind], mode, target)

    async def remove(self, ws: Workspace, path: str) -> None:
        rel = checked_relative(ws, path)
        await self._box(ws).agent("remove_path", ws=ws.path, path=rel)
        self._removed(ws, rel)

    async def make_dir(self, ws: Workspace, path: str) -> None:
        await self._box(ws).agent("make_dir", ws=ws.path, path=checked_relative(ws, path))

    async def rename(self, ws: Workspace, src: str, dst: str) -> None:
        s, d = checked_relative(ws, src), checked_relative(ws, dst)
        await self._box(ws).agent("rename", ws=ws.path, src=s, dst=d)
        self._renamed(ws, s, d)
