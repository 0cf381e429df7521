"""Workspace I/O for application code: one object for the files and runs of one workspace.

:class:`WorkspaceIO` wraps an Engine and a Workspace: put files, stage inputs, run a
program, collect, read, and save a workspace file as a versioned artifact, returning
``artifact://name@version``. Only files under ``work/``, ``out/`` and ``runs/`` may be
saved (never ``skills/``, ``src/``, ``home/``, ``tmp/`` or ``metadata.json``), up to a size
cap. It also takes cheap snapshots of a directory (``out/`` by default) to report which
files a run created or changed, which the ``workspace_exec`` tool shows the model.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from wcmatch import glob as wglob

from ..artifacts import ArtifactScope, ArtifactService
from ..errors import LimitExceeded, PathDenied, UsageError
from ..mime import SNIFF_BYTES
from ..models import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_FILES,
    DEFAULT_MAX_TOTAL_BYTES,
    File,
    InputSpec,
    OutputManifest,
    OutputSpec,
    PutFile,
    RunProgramSpec,
    RunResult,
    Workspace,
    WorkspacePolicy,
)
from ..protocols import Engine
from ..workspace import ConfinedRoot, Stager, normalize_globs, refuse_record, split_relpath

__all__ = [
    "ARTIFACT_ROOTS",
    "DEFAULT_MAX_ARTIFACT_BYTES",
    "FileChange",
    "Snapshot",
    "WorkspaceIO",
    "artifact_path",
]

#: Top-level directories whose files may be saved as artifacts.
ARTIFACT_ROOTS = ("work", "out", "runs")
#: Default cap on one saved artifact.
DEFAULT_MAX_ARTIFACT_BYTES = 64 * 1024 * 1024

#: Workspace path -> (size, fingerprint); equal values mean "unchanged".
Snapshot = dict[str, tuple[int, str]]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SNAPSHOT_ENTRIES = 20_000
_SNAPSHOT_DEPTH = 32


@dataclass(frozen=True, slots=True)
class FileChange:
    """A file a run created or modified."""

    path: str
    size: int
    mime_type: str
    change: Literal["created", "modified"]

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "mime_type": self.mime_type, "change": self.change}


def artifact_path(path: str) -> str:
    """Normalise a path to save (``$OUTPUT_DIR/x``, ``./out/x``) and check it may be saved.

    Raises:
        PathDenied: absolute, ``..``, or not under ``work/``, ``out/`` or ``runs/``.
    """
    raw = path.strip()
    normalized = normalize_globs([raw])[0] if raw else ""
    parts = split_relpath(normalized)
    if len(parts) < 2 or parts[0] not in ARTIFACT_ROOTS:
        raise PathDenied(path, "only files under work/, out/ or runs/ can be saved as artifacts")
    return "/".join(parts)


class WorkspaceIO:
    """Files and runs of one workspace, for application code.

    Args:
        engine: the backend.
        workspace: the workspace to work in.
        artifacts: where saved artifacts go and ``artifact://`` inputs come from
            (default: the service the engine was opened with).
        scope: the artifacts' scope (default: from the workspace id ``app/user/session``).
        max_artifact_bytes: largest file :meth:`save_artifact` accepts.
    """

    def __init__(
        self,
        engine: Engine,
        workspace: Workspace,
        artifacts: ArtifactService | None = None,
        scope: ArtifactScope | None = None,
        *,
        max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
    ) -> None:
        self.engine = engine
        self.workspace = workspace
        self._artifacts = artifacts
        self._scope = scope
        self.max_artifact_bytes = max_artifact_bytes

    @classmethod
    async def open(
        cls, engine: Engine, exec_id: str, policy: WorkspacePolicy | None = None, **options: Any
    ) -> WorkspaceIO:
        """Create (or reuse, with session persistence) the workspace ``exec_id`` and wrap it."""
        return cls(engine, await engine.manager.create_workspace(exec_id, policy), **options)

    @property
    def artifacts(self) -> ArtifactService | None:
        return self._artifacts if self._artifacts is not None else self.engine.fs.artifacts

    @property
    def scope(self) -> ArtifactScope:
        return self._scope or ArtifactScope.from_workspace_id(self.workspace.id)

    def _stager(self) -> Stager:
        return Stager(self.engine.fs, artifacts=self.artifacts, host_roots=self.engine.fs.host_roots)

    # -- files in -------------------------------------------------------------------

    async def put_files(self, files: Sequence[PutFile]) -> None:
        """Write files (workspace-relative paths; escapes and the workspace's record ``metadata.json`` raise
        ``PathDenied``)."""
        for f in files:
            refuse_record(f.path)
        await self.engine.fs.put_files(self.workspace, files)

    async def put(self, path: str, content: bytes | str, mode: int = 0o644) -> None:
        await self.put_files([PutFile(path, content, mode)])

    async def stage_inputs(self, inputs: Sequence[InputSpec]) -> list[str]:
        """Stage inputs (``artifact://``, ``host://``, ``workspace://``, ``skill://``, bytes) in this scope."""
        return await self._stager().stage_inputs(self.workspace, inputs, scope=self.scope)

    # -- running --------------------------------------------------------------------

    async def run_program(self, spec: RunProgramSpec) -> RunResult:
        """Run to completion or deadline; a non-zero exit is data, not an error."""
        return await self.engine.runner.run_program(self.workspace, spec)

    async def run(self, cmd: str, args: Sequence[str] = (), **options: Any) -> RunResult:
        """Shorthand for ``run_program(RunProgramSpec(cmd, args, **options))``."""
        return await self.run_program(RunProgramSpec(cmd, args, **options))

    # -- files out ------------------------------------------------------------------

    async def read(self, path: str, *, max_bytes: int | None = None) -> File:
        """One file; ``PathDenied`` on escape or link, ``FileNotFoundError`` if absent."""
        return await self.engine.fs.read_file(self.workspace, path, max_bytes=max_bytes)

    async def collect(
        self,
        patterns: Sequence[str] = ("out/**",),
        *,
        max_files: int = DEFAULT_MAX_FILES,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    ) -> list[File]:
        """Regular files matching the globs, with caps, never through a symlink."""
        return await self.engine.fs.collect(
            self.workspace,
            patterns,
            max_files=max_files,
            max_file_bytes=max_file_bytes,
            max_total_bytes=max_total_bytes,
        )

    async def collect_outputs(self, spec: OutputSpec | None = None) -> OutputManifest:
        """Collect (and with ``spec.save``, save) outputs in this facade's artifact scope."""
        return await self._stager().collect_outputs(self.workspace, spec, scope=self.scope)

    async def save_artifact(self, path: str, *, max_bytes: int | None = None) -> str:
        """Save one workspace file as the next version of the artifact named by its path.

        Returns ``artifact://<path>@<version>``.

        Raises:
            PathDenied: not under work/, out/ or runs/; a symlink, hard link or not a regular file.
            FileNotFoundError: no such file.
            LimitExceeded: larger than ``max_bytes`` (default ``max_artifact_bytes``).
            UsageError: no artifact service.
        """
        rel = artifact_path(path)
        if self.artifacts is None:
            raise UsageError("saving artifacts needs an artifact service: pass artifacts=... (or to open_engine)")
        cap = max_bytes if max_bytes is not None else self.max_artifact_bytes
        # read one byte first: precise errors (missing, link, too big) before anything is saved
        probe = await self.engine.fs.read_file(self.workspace, rel, max_bytes=1)
        if probe.size_bytes > cap:
            raise LimitExceeded(f"{rel!r} is {probe.size_bytes} bytes, more than the {cap}-byte artifact cap")
        spec = OutputSpec(
            globs=[str(wglob.escape(rel))], max_files=1, max_file_bytes=cap, max_total_bytes=cap, save=True
        )
        manifest = await self.collect_outputs(spec)
        saved = [f.saved_as for f in manifest.files if f.saved_as]
        if len(saved) != 1:
            raise FileNotFoundError(f"{rel!r} changed while it was being saved (removed, linked or replaced)")
        return saved[0]

    # -- change tracking ------------------------------------------------------------

    async def snapshot(self, top: str = "out") -> Snapshot:
        """Fingerprints of the regular files under ``top`` (symlinks are neither followed nor listed)."""
        parts = split_relpath(top)
        if self.workspace.host_path is not None:
            return await asyncio.to_thread(_host_snapshot, str(self.workspace.host_path), parts)
        # no host path: fingerprint by content, within the collection caps
        files = await self.collect([f"{'/'.join(parts)}/**"])
        return {f.name: (f.size_bytes, hashlib.sha256(f.content).hexdigest()) for f in files}

    async def changes(self, before: Snapshot, *, top: str = "out", limit: int = 50) -> tuple[list[FileChange], int]:
        """Files under ``top`` created or modified since ``before``: the first ``limit``, and how many in all."""
        after = await self.snapshot(top)
        changed = [p for p in sorted(after) if before.get(p) != after[p]]
        listed = [
            FileChange(p, after[p][0], await self._mime(p), "modified" if p in before else "created")
            for p in changed[:limit]
        ]
        return listed, len(changed)

    async def _mime(self, path: str) -> str:
        try:
            return (await self.read(path, max_bytes=SNIFF_BYTES)).mime_type
        except (PathDenied, FileNotFoundError):
            return "application/octet-stream"


def _host_snapshot(root: str, top: list[str]) -> Snapshot:
    found: Snapshot = {}
    with ConfinedRoot(root) as cr:
        try:
            fd = cr.open_dir(top)
        except (FileNotFoundError, NotADirectoryError, PathDenied):
            return found  # missing, or replaced by a symlink: nothing of ours to report
    _scan(fd, "/".join(top), found, 0)
    return found


def _scan(fd: int, prefix: str, found: Snapshot, depth: int) -> None:
    """Record regular files below ``fd`` (closed on return); bounded in entries and depth."""
    try:
        with os.scandir(fd) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            if len(found) >= _SNAPSHOT_ENTRIES:
                return
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            rel = f"{prefix}/{e.name}"
            if stat.S_ISREG(st.st_mode):
                # inode and mtime: a same-size rewrite or a replacement by rename still shows up
                found[rel] = (st.st_size, f"{st.st_ino}:{st.st_mtime_ns}")
            elif stat.S_ISDIR(st.st_mode) and depth < _SNAPSHOT_DEPTH:
                try:
                    sub = os.open(e.name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue
                _scan(sub, rel, found, depth + 1)
    finally:
        os.close(fd)
