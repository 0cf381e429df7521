"""Staging inputs and collecting outputs, written once for every backend.

Everything here goes through the :class:`~execspace.protocols.WorkspaceFS`
primitives (``put_files``, ``read_file``, ``collect``, ``stage_directory``, the
backend's ``check`` rule, and the optional ``link_host``), so it works the same on host
directories, containers and remote sandboxes. ``metadata.json`` is read and written
through the same primitives; its read-modify-write cycles are serialised per workspace
by a :class:`MetadataLocks` object that the file system owns.

:class:`WorkspaceFSBase` is what a backend's file system inherits (as fsspec's
``AbstractFileSystem``): ``stage_inputs``/``collect_outputs`` by one :class:`Stager`,
``exists`` over ``stat``, ``stage_directory`` over ``put_files``, the metadata locks, the
allowed host roots and a no-op ``check``. A backend writes the primitives only.

Input sources:

- ``artifact://name[@version]``: an artifact from the configured service;
- ``host:///abs/path``: a host file or directory, only inside the allowed host roots;
  directories are copied without following any symlink in them;
- ``workspace://rel/path``: a copy of a file or directory of the same workspace;
- ``skill://name[/rel]``: short for ``workspace://skills/name[/rel]``;
- raw ``bytes`` (``dest`` required).
"""

from __future__ import annotations

import abc
import asyncio
import builtins
import hashlib
import os
import secrets
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from wcmatch import glob as wglob

from ..artifacts import (
    ArtifactScope,
    ArtifactService,
    format_artifact_ref,
    is_user_scoped,
    parse_artifact_ref,
    validate_artifact_name,
)
from ..audit import AuditSink, AuditValue
from ..errors import (
    InputError,
    InvalidSpec,
    LimitExceeded,
    PartialOutputCommit,
    PathDenied,
    UsageError,
)
from ..mime import SNIFF_BYTES, guess_mime
from ..models import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_FILES,
    DEFAULT_MAX_TOTAL_BYTES,
    File,
    FileEntry,
    FileKind,
    FileRef,
    InputSpec,
    OutputManifest,
    OutputSpec,
    PutFile,
    Workspace,
)
from ..tracing import NO_TRACER, AttributeValue, Tracer
from .confine import split_relpath
from .confinecore import MAX_WALK_DEPTH
from .hostroots import HostRoots, HostSource, walk_tree
from .layout import METADATA_FILE
from .metadata import InputRecord, OutputRecord, WorkspaceMetadata, refuse_record

if TYPE_CHECKING:
    from ..protocols import WorkspaceLocks

__all__ = [
    "DEFAULT_INPUT_FILES",
    "MetadataLocks",
    "Stager",
    "StagingFS",
    "SupportsHostLink",
    "WorkspaceFSBase",
    "collect_outputs",
    "load_ws_metadata",
    "save_ws_metadata",
    "stage_inputs",
]

#: Most files one ``workspace://`` or ``skill://`` input may copy.
DEFAULT_INPUT_FILES = 10_000
#: Largest ``metadata.json`` read; a larger one is treated as corrupt (its head is kept aside).
METADATA_MAX_BYTES = 64 * 1024 * 1024

_DEFAULT_INPUT_DIR = "work/inputs"


class StagingFS(Protocol):
    """The primitives staging needs; every :class:`~execspace.protocols.WorkspaceFS` has them."""

    @property
    def locks(self) -> WorkspaceLocks:
        """The per-workspace locks of ``metadata.json``, shared by everything that edits it through this fs."""
        ...

    def check(self, ws: Workspace, path: str, mode: Literal["read", "write"]) -> None:
        """Raise ``PathDenied`` if the backend's file rule forbids ``mode`` at ``path`` (workspace-relative, or
        an absolute host path being read)."""
        ...

    async def put_files(self, ws: Workspace, files: Sequence[PutFile]) -> None: ...

    async def read_file(self, ws: Workspace, path: str, *, max_bytes: int | None = None) -> File: ...

    async def collect(
        self,
        ws: Workspace,
        patterns: Sequence[str],
        *,
        max_files: int = ...,
        max_file_bytes: int = ...,
        max_total_bytes: int = ...,
    ) -> list[File]: ...

    async def stage_directory(self, ws: Workspace, src: Path, dest: str, *, read_only: bool = False) -> None: ...


@runtime_checkable
class SupportsHostLink(Protocol):
    """Optional primitive of file systems whose workspaces are host directories."""

    async def link_host(self, ws: Workspace, src: Path, dest: str) -> None:
        """Make ``dest`` a symlink to the (already allowed) host path ``src``."""
        ...


# -- metadata -------------------------------------------------------------------------


class MetadataLocks:
    """One ``asyncio.Lock`` per workspace id, for read-modify-write of ``metadata.json``.

    Locks are held weakly: an id nobody is using costs nothing. The lock is
    process-local; two processes editing one workspace's record race (the last
    atomic write wins).
    """

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def lock(self, ws: Workspace) -> asyncio.Lock:
        """The lock of ``ws`` (the same object for every handle with the same id)."""
        lock = self._locks.get(ws.id)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[ws.id] = lock
        return lock


async def load_ws_metadata(fs: StagingFS, ws: Workspace) -> WorkspaceMetadata:
    """Read the workspace record through ``fs``.

    A missing record is fresh. A corrupt one is fresh too, and its bytes are first
    written to ``metadata.json.corrupt-<unix time>-<random>`` so nothing is lost;
    ``recovered_from`` names that file. A record that is not a regular file (a
    program replaced it with a link or a directory) cannot be read safely and is
    also started fresh. Call this under :meth:`MetadataLocks.lock` when you will
    write the record back.
    """
    try:
        f = await fs.read_file(ws, METADATA_FILE, max_bytes=METADATA_MAX_BYTES)
    except FileNotFoundError:
        return WorkspaceMetadata(id=ws.id)
    except (PathDenied, IsADirectoryError) as exc:
        return WorkspaceMetadata(id=ws.id, recovered_from=f"<unreadable {METADATA_FILE}: {exc}>")
    if not f.truncated:
        try:
            return WorkspaceMetadata.from_json(f.content)
        except ValueError:
            pass
    aside = f"{METADATA_FILE}.corrupt-{int(time.time())}-{secrets.token_hex(3)}"
    await fs.put_files(ws, [PutFile(aside, f.content, 0o600)])
    return WorkspaceMetadata(id=ws.id, recovered_from=aside)


async def save_ws_metadata(fs: StagingFS, ws: Workspace, meta: WorkspaceMetadata) -> None:
    """Write the workspace record through ``fs`` (mode 0600, atomically where the fs is)."""
    meta.updated_at = time.time()
    if not meta.id:
        meta.id = ws.id
    await fs.put_files(ws, [PutFile(METADATA_FILE, meta.to_json(), 0o600)])


# -- input plans ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Plan:
    """One input, resolved and checked, before anything is written."""

    kind: Literal["artifact", "host", "workspace", "bytes"]
    src: str
    """The source as recorded in metadata."""
    dest: str
    mode: str
    pin: bool = False
    name: str = ""
    """Artifact name, or the workspace path to copy."""
    version: int | None = None
    host: Path | None = None
    data: bytes = b""


def _basename(path: str, src: str) -> str:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts:
        raise InputError(f"cannot derive a file name from input {src!r}; pass dest=...")
    return parts[-1]


def _dest(dest: str | None, basename: str) -> str:
    if not dest:
        dest = f"{_DEFAULT_INPUT_DIR}/{basename}"
    elif dest.endswith("/"):
        dest += basename
    parts = split_relpath(dest)
    refuse_record(dest)
    return "/".join(parts)


def _escape(path: str) -> str:
    return str(wglob.escape(path))


def _exec_mode(data: bytes) -> int:
    # File carries no mode bits: keep scripts runnable
    return 0o755 if data.startswith(b"#!") else 0o644


class Stager:
    """Stages inputs into workspaces and collects outputs from them, over any ``fs``.

    Args:
        fs: the backend's file system (the primitives of :class:`StagingFS`).
        artifacts: the service for ``artifact://`` inputs and saved outputs.
        host_roots: host directories ``host://`` inputs may come from; nothing else is reachable.
        locks: the per-workspace metadata locks; default ``fs.locks``.
        max_input_bytes: cap on one host file and on one workspace/skill copy.
        max_input_files: cap on the files of one workspace/skill copy.
    """

    def __init__(
        self,
        fs: StagingFS,
        *,
        artifacts: ArtifactService | None = None,
        host_roots: Sequence[Path | str] = (),
        locks: WorkspaceLocks | None = None,
        max_input_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
        max_input_files: int = DEFAULT_INPUT_FILES,
    ) -> None:
        self.fs = fs
        self.artifacts = artifacts
        self._roots = HostRoots(host_roots)
        self.host_roots = self._roots.roots
        self.locks = fs.locks if locks is None else locks
        self.max_input_bytes = max_input_bytes
        self.max_input_files = max_input_files

    # -- inputs ---------------------------------------------------------------------

    async def stage_inputs(
        self, ws: Workspace, inputs: Sequence[InputSpec], *, scope: ArtifactScope | None = None
    ) -> list[str]:
        """Stage every input and record it in ``metadata.json``; return the destinations.

        All inputs are checked (scheme, paths, allowed roots, services) before the
        first one is written. If staging stops half-way, the inputs already staged
        are still recorded, then the error is raised.

        Raises:
            InputError: unknown scheme, missing source, no artifact service.
            PathDenied: a host path outside the allowed roots, or a path leaving the workspace.
            UsageError: ``mode='link'`` where it cannot work.
            ArtifactNotFound: the artifact (version) does not exist.
            LimitExceeded: a source is larger than the input caps.
        """
        scope = scope or ArtifactScope.from_workspace_id(ws.id)
        plans = [self._plan(spec) for spec in inputs]
        written: list[str] = []
        async with self.locks.lock(ws):
            meta = await load_ws_metadata(self.fs, ws)
            try:
                for plan in plans:
                    meta.inputs.append(await self._stage(ws, plan, scope, meta))
                    written.append(plan.dest)
            finally:
                if written or meta.recovered_from:
                    await save_ws_metadata(self.fs, ws, meta)
        return written

    def _plan(self, spec: InputSpec) -> _Plan:
        src = spec.src
        if isinstance(src, bytes | bytearray | memoryview):
            self._copy_only(spec, "raw bytes")
            if not spec.dest or spec.dest.endswith("/"):
                raise InvalidSpec("raw-bytes inputs need a file path as dest (not a directory)")
            return _Plan("bytes", "bytes", _dest(spec.dest, ""), spec.mode, data=bytes(src))
        if not isinstance(src, str):
            raise InvalidSpec(f"input src must be a string or bytes, got {type(src).__name__}")
        if src.startswith("artifact://"):
            self._copy_only(spec, "artifact")
            if self.artifacts is None:
                raise InputError("no artifact service configured: pass artifacts=... to open_engine")
            name, version = parse_artifact_ref(src)
            bare = name[len("user:") :] if is_user_scoped(name) else name
            dest = _dest(spec.dest, _basename(bare, src))
            return _Plan("artifact", src, dest, spec.mode, spec.pin, name=name, version=version)
        if src.startswith("host://"):
            return self._plan_host(spec, src)
        if src.startswith("workspace://"):
            return self._plan_workspace(spec, src, src[len("workspace://") :], "")
        if src.startswith("skill://"):
            return self._plan_workspace(spec, src, src[len("skill://") :], "skills/")
        raise InputError(
            f"unsupported input source {src!r}: use artifact://name[@version], host:///abs/path, "
            "workspace://rel/path, skill://name[/rel] or raw bytes"
        )

    @staticmethod
    def _copy_only(spec: InputSpec, what: str) -> None:
        if spec.mode == "link":
            raise UsageError(f"mode='link' works only for host:// inputs, not for {what}; use mode='copy'")

    def _plan_host(self, spec: InputSpec, src: str) -> _Plan:
        path = src[len("host://") :]
        if not path.startswith("/") or "\0" in path:
            raise InputError(f"host inputs need an absolute path (host:///abs/path), got {src!r}")
        real = self._roots.check(path)
        if spec.mode == "link" and not isinstance(self.fs, SupportsHostLink):
            raise UsageError("link mode needs a backend with host paths; use mode='copy'")
        dest = _dest(spec.dest, _basename(PurePosixPath(path).name, src))
        return _Plan("host", src, dest, spec.mode, host=real)

    def _plan_workspace(self, spec: InputSpec, src: str, rel: str, prefix: str) -> _Plan:
        self._copy_only(spec, "workspace or skill sources")
        if not rel:
            raise InputError(f"input {src!r} names no path")
        parts = split_relpath(rel)  # refuses '..', absolute paths, NUL
        path = prefix + "/".join(parts)
        return _Plan("workspace", src, _dest(spec.dest, parts[-1]), spec.mode, name=path)

    async def _stage(self, ws: Workspace, plan: _Plan, scope: ArtifactScope, meta: WorkspaceMetadata) -> InputRecord:
        fs = self.fs
        if plan.kind == "bytes":
            await fs.put_files(ws, [PutFile(plan.dest, plan.data, 0o644)])
            digest = f"sha256:{hashlib.sha256(plan.data).hexdigest()}"
            return InputRecord(plan.src, plan.dest, digest, plan.mode)
        if plan.kind == "artifact":
            assert self.artifacts is not None  # checked by _plan
            version = plan.version
            if version is None and plan.pin:
                version = meta.last_input_version(plan.dest, plan.name)
            art = await self.artifacts.load(scope, plan.name, version)
            await fs.put_files(ws, [PutFile(plan.dest, art.data, 0o644)])
            return InputRecord(plan.src, plan.dest, plan.name, plan.mode, art.version)
        if plan.kind == "host":
            assert plan.host is not None
            await self._stage_host(ws, plan, plan.host)
            return InputRecord(plan.src, plan.dest, str(plan.host), plan.mode)
        await self._copy_in_workspace(ws, plan.name, plan.dest)
        return InputRecord(plan.src, plan.dest, plan.name, plan.mode)

    async def _stage_host(self, ws: Workspace, plan: _Plan, real: Path) -> None:
        try:
            source = await asyncio.to_thread(self._roots.open, real)
        except FileNotFoundError:
            raise InputError(f"host input {plan.src!r} does not exist") from None
        with source:
            # the backend's rules on host paths (e.g. credential stores) hold inside host_roots too
            self.fs.check(ws, str(source.path), "read")
            if plan.mode == "link":
                assert isinstance(self.fs, SupportsHostLink)  # checked by _plan
                await self.fs.link_host(ws, source.path, plan.dest)
            elif source.is_dir:
                await self.fs.stage_directory(ws, source.path, plan.dest)
            else:
                data, mode = await asyncio.to_thread(_read_host_file, source, self.max_input_bytes)
                await self.fs.put_files(ws, [PutFile(plan.dest, data, mode)])

    async def _copy_in_workspace(self, ws: Workspace, path: str, dest: str) -> None:
        files = await self.fs.collect(
            ws,
            [_escape(path), _escape(path) + "/**"],
            max_files=self.max_input_files + 1,
            max_file_bytes=self.max_input_bytes,
            max_total_bytes=self.max_input_bytes + 1,
        )
        if not files:
            # no regular file at or under the path: let read_file say why
            try:
                files = [await self.fs.read_file(ws, path, max_bytes=self.max_input_bytes + 1)]
            except FileNotFoundError:
                raise InputError(f"workspace path {path!r} does not exist") from None
        if len(files) > self.max_input_files:
            raise LimitExceeded(
                f"{path!r} holds more than {self.max_input_files} files; raise max_input_files or copy less"
            )
        total = sum(len(f.content) for f in files)
        if total > self.max_input_bytes or any(f.truncated or len(f.content) < f.size_bytes for f in files):
            raise LimitExceeded(
                f"{path!r} is larger than the {self.max_input_bytes}-byte input cap; raise max_input_bytes"
            )
        puts = []
        for f in files:
            target = dest if f.name == path else f"{dest}/{f.name[len(path) + 1 :]}"
            puts.append(PutFile(target, f.content, _exec_mode(f.content)))
        await self.fs.put_files(ws, puts)

    # -- outputs --------------------------------------------------------------------

    async def collect_outputs(
        self, ws: Workspace, spec: OutputSpec | None = None, *, scope: ArtifactScope | None = None
    ) -> OutputManifest:
        """Collect the files matching ``spec.globs`` with its caps; save and record them.

        At most ``max_files`` files are returned; each one's content is cut to
        ``max_file_bytes`` and to what is left of ``max_total_bytes``, after which
        collection stops. ``limits_hit`` says that a cap cut something.

        Raises:
            LimitExceeded: ``save=True`` and a file was truncated (nothing is saved).
            UsageError: ``save=True`` without an artifact service.
            PartialOutputCommit: everything was collected (and saved) but
                ``metadata.json`` could not be updated; ``.manifest`` has the result.
        """
        spec = spec or OutputSpec()
        if isinstance(spec.globs, str):
            raise InvalidSpec("OutputSpec.globs must be a sequence of patterns, not one string")
        if spec.save and self.artifacts is None:
            raise UsageError("save=True needs an artifact service: pass artifacts=... to open_engine")
        scope = scope or ArtifactScope.from_workspace_id(ws.id)
        globs = list(spec.globs)
        # one file and one byte more than allowed: tells "exactly at the cap" from "cut by it"
        raw = await self.fs.collect(
            ws,
            globs,
            max_files=spec.max_files + 1,
            max_file_bytes=spec.max_file_bytes,
            max_total_bytes=spec.max_total_bytes + 1,
        )
        files, limits_hit = _apply_caps(raw, spec)

        if spec.save:
            for f in files:
                if f.truncated:
                    cap = "max_file_bytes" if f.size_bytes > spec.max_file_bytes else "max_total_bytes"
                    raise LimitExceeded(
                        f"cannot save truncated output file {f.name!r} ({f.size_bytes} bytes): "
                        f"raise OutputSpec.{cap} (now {getattr(spec, cap)}) or narrow the globs"
                    )
                validate_artifact_name(spec.name_prefix + f.name)

        refs: list[FileRef] = []
        for f in files:
            saved_as: str | None = None
            version: int | None = None
            if spec.save and f.skipped is None:
                assert self.artifacts is not None
                name = spec.name_prefix + f.name
                version = await self.artifacts.save(scope, name, f.content, f.mime_type)
                saved_as = format_artifact_ref(name, version)
            refs.append(
                FileRef(
                    name=f.name,
                    mime_type=f.mime_type,
                    size_bytes=f.size_bytes,
                    truncated=f.truncated,
                    content=f.content if spec.inline else None,
                    saved_as=saved_as,
                    version=version,
                    host_path=ws.host_path / f.name if ws.host_path is not None else None,
                    skipped=f.skipped,
                )
            )
        manifest = OutputManifest(tuple(refs), limits_hit)

        record = OutputRecord(
            globs=globs,
            files=[r.name for r in refs],
            saved_as=[r.saved_as for r in refs if r.saved_as],
            limits_hit=limits_hit,
        )
        try:
            async with self.locks.lock(ws):
                meta = await load_ws_metadata(self.fs, ws)
                meta.outputs.append(record)
                await save_ws_metadata(self.fs, ws, meta)
        except Exception as exc:
            saved = " and saved" if spec.save else ""
            raise PartialOutputCommit(
                f"{len(refs)} output file(s) were collected{saved} but {METADATA_FILE} could not be "
                f"updated ({exc}); the result is in this error's .manifest",
                manifest,
                exc,
            ) from exc
        return manifest


def _apply_caps(files: Sequence[File], spec: OutputSpec) -> tuple[list[File], bool]:
    """Enforce the caps of ``spec`` on what the fs returned, whatever it enforced itself."""
    out: list[File] = []
    remaining = spec.max_total_bytes
    hit = False
    for f in files:
        if len(out) >= spec.max_files or remaining <= 0:
            hit = True
            break
        content = f.content[: min(spec.max_file_bytes, remaining)]
        truncated = f.skipped is None and (f.truncated or len(content) < f.size_bytes)
        hit = hit or truncated
        remaining -= len(content)
        out.append(File(f.name, content, f.mime_type, f.size_bytes, truncated, f.skipped))
    return out, hit


def _read_host_file(source: HostSource, cap: int) -> tuple[bytes, int]:
    if source.st.st_size > cap:
        raise LimitExceeded(
            f"host file {str(source.path)!r} is {source.st.st_size} bytes, more than the {cap}-byte input cap; "
            "raise max_input_bytes or stage its directory"
        )
    chunks: list[bytes] = []
    size = 0
    while size <= cap and (chunk := os.read(source.fd, cap + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
    if size > cap:
        raise LimitExceeded(f"host file {str(source.path)!r} grew past the {cap}-byte input cap while being read")
    return b"".join(chunks), 0o755 if source.st.st_mode & 0o111 else 0o644


# -- the base every backend's file system inherits ----------------------------------------

#: Most files (and bytes: the total collect cap) :meth:`WorkspaceFSBase.stage_directory` uploads.
_UPLOAD_FILES = 10_000


#: Reads one file for :func:`read_within_caps`: (workspace path, most bytes to keep) -> (kept bytes, its size).
CappedRead = Callable[[str, int], Awaitable[tuple[bytes, int]]]


async def read_within_caps(
    found: Iterable[tuple[str, FileKind, int]],
    read: CappedRead,
    *,
    max_files: int,
    max_file_bytes: int,
    max_total_bytes: int,
) -> list[File]:
    """``collect`` for file APIs that read one file per request (remote workspaces), over the listed
    ``(path, kind, nlink)``: regular files only, never one with other hard links (it may alias a file outside), at
    most ``max_files``, each cut at ``max_file_bytes`` and at what is left of ``max_total_bytes``; a file swapped for
    a link or removed since it was listed (``PathDenied``, ``FileNotFoundError``) is skipped, never followed."""
    files: list[File] = []
    budget = max_total_bytes
    for path, kind, nlink in found:
        if kind is not FileKind.FILE or nlink > 1:
            continue
        if len(files) >= max_files or budget <= 0:
            break
        try:
            data, size = await read(path, min(max_file_bytes, budget))
        except (PathDenied, FileNotFoundError):
            continue
        budget -= len(data)
        files.append(File(path, data, guess_mime(path, data[:SNIFF_BYTES]), size, len(data) < size))
    return files


def checked_depth(depth: int) -> int:
    if depth < 1:
        raise UsageError(f"depth must be at least 1 (the directory's own entries), got {depth}")
    return depth


class WorkspaceFSBase(abc.ABC):
    """Defaults over a backend's file primitives, written once (fsspec's ``AbstractFileSystem`` model).

    A backend implements the primitives (``put_files``, ``read_file``, ``collect``, ``list``, ``stat``,
    ``remove``, ``make_dir``, ``rename``) and inherits ``stage_inputs``/``collect_outputs`` (one
    :class:`Stager` over them), ``exists`` (over ``stat``), ``stage_directory`` (the allowed host tree
    uploaded with ``put_files``), the metadata ``locks``, the allowed ``host_roots`` and ``check``, the
    backend's file rule (none here: a backend with one overrides it). Its primitives write their audit lines with
    ``_wrote``, ``_renamed`` and ``_removed`` once the change is made, so every backend's lines are the same.
    """

    def __init__(
        self,
        artifacts: ArtifactService | None = None,
        host_roots: Sequence[Path | str] = (),
        *,
        tracer: Tracer = NO_TRACER,
        audit: AuditSink | None = None,
    ) -> None:
        self.artifacts = artifacts
        self.tracer = tracer
        """A span of each staging and each collection."""
        self.audit = audit
        """Where a line of each file written, renamed or removed goes (path and size: never the content)."""
        self.roots = HostRoots(host_roots)
        self.host_roots = self.roots.roots
        self.locks = MetadataLocks()
        self._stager: Stager | None = None

    def audit_fields(self, ws: Workspace) -> dict[str, AuditValue]:
        """What every file line of ``ws`` names (a remote backend adds where the workspace lives)."""
        return {"workspace": ws.id}

    def _wrote(self, ws: Workspace, written: Sequence[tuple[str, int]]) -> None:
        if self.audit is not None:
            for path, size in written:
                self.audit.record("file.write", {**self.audit_fields(ws), "path": path, "size": size})

    def _renamed(self, ws: Workspace, src: str, dst: str) -> None:
        if self.audit is not None:
            self.audit.record("file.rename", {**self.audit_fields(ws), "path": src, "to": dst})

    def _removed(self, ws: Workspace, path: str) -> None:
        if self.audit is not None:
            self.audit.record("file.remove", {**self.audit_fields(ws), "path": path})

    @abc.abstractmethod
    async def put_files(self, ws: Workspace, files: Sequence[PutFile]) -> None: ...

    @abc.abstractmethod
    async def read_file(self, ws: Workspace, path: str, *, max_bytes: int | None = None) -> File: ...

    @abc.abstractmethod
    async def collect(
        self,
        ws: Workspace,
        patterns: Sequence[str],
        *,
        max_files: int = DEFAULT_MAX_FILES,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    ) -> list[File]: ...

    @abc.abstractmethod
    async def stat(self, ws: Workspace, path: str) -> FileEntry: ...

    def check(self, ws: Workspace, path: str, mode: Literal["read", "write"]) -> None:  # noqa: B027 - a default
        """Raise ``PathDenied`` if the backend's file rule forbids ``mode`` at ``path``; here, no rule."""

    async def list_dir(self, ws: Workspace, path: str, *, depth: int = 1) -> builtins.list[FileEntry]:
        """The entries below the directory ``path``, down to ``depth`` levels: :meth:`list` with one pattern per
        level, as deep as a walk may go (a backend that can walk to a depth overrides it)."""
        base = wglob.escape(path.rstrip("/"))
        levels = min(checked_depth(depth), MAX_WALK_DEPTH)
        return await self.list(ws, [base + "/*" * level for level in range(1, levels + 1)])

    @abc.abstractmethod
    async def list(self, ws: Workspace, patterns: Sequence[str]) -> builtins.list[FileEntry]: ...

    async def exists(self, ws: Workspace, path: str) -> bool:
        """Whether an entry of any kind (a dangling symlink too) is at ``path``."""
        try:
            await self.stat(ws, path)
        except FileNotFoundError:
            return False
        return True

    async def stage_directory(self, ws: Workspace, src: Path, dest: str, *, read_only: bool = False) -> None:
        """Upload the allowed host tree ``src`` to ``dest``; symlinks in it are skipped, never followed."""
        if not Path(src).is_absolute():
            raise PathDenied(str(src), "stage_directory needs an absolute host path")
        dest = "/".join(split_relpath(dest))
        self.check(ws, dest, "write")
        puts = await asyncio.to_thread(self._read_host_tree, ws, Path(src), dest, read_only)
        await self.put_files(ws, puts)

    def _read_host_tree(self, ws: Workspace, src: Path, dest: str, read_only: bool) -> builtins.list[PutFile]:
        """The regular files of the allowed host tree ``src`` the file rule lets us read, capped."""

        def keep(rel: tuple[str, ...]) -> bool:
            try:
                self.check(ws, os.path.join(source.path, *rel), "read")
            except PathDenied:
                return False
            self.check(ws, "/".join((dest, *rel)), "write")
            return True

        puts: list[PutFile] = []
        total = 0
        with self.roots.open(src) as source:
            if not source.is_dir:
                raise InputError(f"stage_directory needs a directory, and {src} is a file")
            self.check(ws, str(source.path), "read")
            for entry in walk_tree(source.fd, keep):
                if entry.fd is None:
                    continue
                with os.fdopen(os.dup(entry.fd), "rb") as f:
                    data = f.read(DEFAULT_MAX_TOTAL_BYTES - total + 1)
                total += len(data)
                if total > DEFAULT_MAX_TOTAL_BYTES or len(puts) >= _UPLOAD_FILES:
                    raise LimitExceeded(
                        f"{src} is larger than {DEFAULT_MAX_TOTAL_BYTES} bytes or {_UPLOAD_FILES} files"
                    )
                mode = entry.st.st_mode & (0o555 if read_only else 0o755)
                puts.append(PutFile("/".join((dest, *entry.rel)), data, mode))
        return puts

    @property
    def stager(self) -> Stager:
        """The stager over this file system, with its artifacts, host roots and locks."""
        if self._stager is None:
            self._stager = Stager(self, artifacts=self.artifacts, host_roots=self.host_roots, locks=self.locks)
        return self._stager

    async def stage_inputs(self, ws: Workspace, inputs: Sequence[InputSpec]) -> builtins.list[str]:
        """Stage inputs (artifact, host, workspace, skill, bytes); return the workspace paths written."""
        attributes: dict[str, AttributeValue] = {"execspace.workspace.id": ws.id, "execspace.stage.inputs": len(inputs)}
        with self.tracer.span("execspace.stage", attributes):
            return await self.stager.stage_inputs(ws, inputs)

    async def collect_outputs(self, ws: Workspace, spec: OutputSpec | None = None) -> OutputManifest:
        """Collect outputs with caps, optionally saving them as artifacts, and record them in metadata."""
        with self.tracer.span("execspace.collect", {"execspace.workspace.id": ws.id}) as span:
            manifest = await self.stager.collect_outputs(ws, spec)
            span.set("execspace.collect.files", len(manifest.files))
            span.set("execspace.collect.limits_hit", manifest.limits_hit)
            return manifest


# -- functional front ---------------------------------------------------------------


async def stage_inputs(
    fs: StagingFS,
    ws: Workspace,
    inputs: Sequence[InputSpec],
    *,
    artifacts: ArtifactService | None = None,
    scope: ArtifactScope | None = None,
    host_roots: Sequence[Path | str] = (),
    locks: WorkspaceLocks | None = None,
) -> list[str]:
    """Stage ``inputs`` into ``ws``; see :meth:`Stager.stage_inputs`."""
    stager = Stager(fs, artifacts=artifacts, host_roots=host_roots, locks=locks)
    return await stager.stage_inputs(ws, inputs, scope=scope)


async def collect_outputs(
    fs: StagingFS,
    ws: Workspace,
    spec: OutputSpec | None = None,
    *,
    artifacts: ArtifactService | None = None,
    scope: ArtifactScope | None = None,
    locks: WorkspaceLocks | None = None,
) -> OutputManifest:
    """Collect outputs of ``ws``; see :meth:`Stager.collect_outputs`."""
    return await Stager(fs, artifacts=artifacts, locks=locks).collect_outputs(ws, spec, scope=scope)
