"""The Engine seam: what every backend implements.

These protocols are the specification for backend authors. Each method documents
what it must return and what it must raise; the conformance suite in
``tests/conformance`` checks the behaviour on every backend.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal, Protocol, runtime_checkable

from .artifacts import ArtifactService
from .capabilities import Capabilities
from .models import (
    BlockResult,
    CellResult,
    CodeBlock,
    File,
    FileEntry,
    InputSpec,
    OutputChunk,
    OutputManifest,
    OutputSpec,
    ProgramInfo,
    PtySize,
    PutFile,
    ResourceLimits,
    RunProgramSpec,
    RunResult,
    Snapshot,
    Workspace,
    WorkspacePolicy,
)

__all__ = [
    "CellKernels",
    "Engine",
    "FileReader",
    "Kernels",
    "ProgramHandle",
    "ProgramRunner",
    "SupportsCpuUsage",
    "SupportsFileMetadata",
    "SupportsFileStreams",
    "SupportsFreezing",
    "SupportsKernels",
    "SupportsSnapshots",
    "WorkspaceFS",
    "WorkspaceLocks",
    "WorkspaceManager",
]


@runtime_checkable
class WorkspaceManager(Protocol):
    """Creates, finds and removes workspaces."""

    async def create_workspace(
        self, exec_id: str, policy: WorkspacePolicy | None = None, *, path: Path | None = None
    ) -> Workspace:
        """Return the workspace for ``exec_id``, creating it with the standard layout.

        With session persistence the same id yields the same workspace, created once
        even under concurrent calls. ``path`` adopts that host directory as the
        workspace (backends without host paths raise ``UnsupportedBackend``).
        """
        ...

    async def get_workspace(self, exec_id: str) -> Workspace:
        """Return an existing workspace; raise ``WorkspaceNotFound`` if there is none."""
        ...

    async def cleanup(self, ws: Workspace) -> None:
        """Stop the workspace's programs still running, then remove it and everything in it (never following
        a link out of it). Idempotent."""
        ...


@runtime_checkable
class WorkspaceLocks(Protocol):
    """One lock per workspace for the read-modify-write of its record (``metadata.json``) through one
    :class:`WorkspaceFS`: whatever edits the record through that fs (staging, output collection, the skills' digests)
    holds ``lock(ws)`` meanwhile. The locks are this process's: two processes editing one record race, and the last
    whole write wins."""

    def lock(self, ws: Workspace) -> asyncio.Lock:
        """The lock of ``ws``: the same object for every handle of the same workspace id."""
        ...


@runtime_checkable
class WorkspaceFS(Protocol):
    """Moves files into and out of workspaces, confined to the workspace root.

    Every path is workspace-relative, or absolute in the program's view: under ``ws.path`` (``/workspace/out/x``
    in a sandbox is ``out/x``; :mod:`execspace.workspace.programpaths`). Any other absolute path, ``..`` and a
    symlink in any component raise ``PathDenied`` (nothing is ever followed through a link). Backends inherit
    :class:`~execspace.workspace.staging.WorkspaceFSBase`, which gives ``stage_inputs``,
    ``collect_outputs``, ``exists``, ``stage_directory``, ``locks``, ``host_roots`` and a no-op
    ``check`` over the primitives; they write the primitives.
    """

    artifacts: ArtifactService | None
    """The service ``artifact://`` inputs come from and saved outputs go to (None: none configured)."""
    host_roots: tuple[Path, ...]
    """The host directories ``host://`` inputs and ``stage_directory`` may read from, resolved."""

    @property
    def locks(self) -> WorkspaceLocks:
        """Per-workspace locks for the read-modify-write of ``metadata.json`` through this fs."""
        ...

    def check(self, ws: Workspace, path: str, mode: Literal["read", "write"]) -> None:
        """Raise ``PathDenied`` if the backend's file rule forbids ``mode`` at ``path`` (workspace-relative,
        or an absolute host path being read); every operation below runs it first."""
        ...

    async def put_files(self, ws: Workspace, files: Sequence[PutFile]) -> None:
        """Write files; raise ``PathDenied`` for paths that leave the workspace."""
        ...

    async def stage_directory(self, ws: Workspace, src: Path, dest: str, *, read_only: bool = False) -> None:
        """Copy a host directory tree into ``dest`` (no symlinks followed out of ``src``)."""
        ...

    async def read_file(self, ws: Workspace, path: str, *, max_bytes: int | None = None) -> File:
        """Read one file; raise ``PathDenied`` on escape, ``FileNotFoundError`` if absent."""
        ...

    async def collect(
        self,
        ws: Workspace,
        patterns: Sequence[str],
        *,
        max_files: int = ...,
        max_file_bytes: int = ...,
        max_total_bytes: int = ...,
    ) -> list[File]:
        """Read the regular files matching the globs (``**`` allowed), never through a symlink."""
        ...

    async def list(self, ws: Workspace, patterns: Sequence[str]) -> list[FileEntry]:
        """The entries matching the globs, without reading any content, in walk order (sorted).

        Every kind is listed: regular files, directories (their own size; walked into), symlinks (never followed:
        their own size and mtime) and others. Patterns are those of :meth:`collect`; one that is absolute
        or climbs out raises ``PathDenied``. Entries the backend's rule hides are left out.
        """
        ...

    async def list_dir(self, ws: Workspace, path: str, *, depth: int = 1) -> builtins.list[FileEntry]:
        """The entries below the directory ``path``, down to ``depth`` levels (1: its own entries), as
        :meth:`list` gives them; a walk that goes no deeper. Nothing (``[]``) when ``path`` is no directory.
        ``depth`` below 1 raises ``UsageError``."""
        ...

    async def stat(self, ws: Workspace, path: str) -> FileEntry:
        """The entry at ``path`` itself (a symlink is reported, not followed); ``FileNotFoundError`` if absent."""
        ...

    async def exists(self, ws: Workspace, path: str) -> bool:
        """Whether any entry (a dangling symlink too) is at ``path``; a refused path raises ``PathDenied``."""
        ...

    async def remove(self, ws: Workspace, path: str) -> None:
        """Remove the file, link or whole tree at ``path``, never following a link (a read-only staged tree
        too); ``FileNotFoundError`` if nothing is there."""
        ...

    async def make_dir(self, ws: Workspace, path: str) -> None:
        """Create the directory ``path`` with missing parents; an existing directory is fine, anything else
        in the way raises ``PathDenied``."""
        ...

    async def rename(self, ws: Workspace, src: str, dst: str) -> None:
        """Move ``src`` (a link moves as a link) to ``dst``, replacing a file there, creating ``dst``'s parents;
        ``FileNotFoundError`` if ``src`` is absent."""
        ...

    async def stage_inputs(self, ws: Workspace, inputs: Sequence[InputSpec]) -> builtins.list[str]:
        """Stage inputs (artifact, host, workspace, skill, bytes); return the workspace paths written."""
        ...

    async def collect_outputs(self, ws: Workspace, spec: OutputSpec | None = None) -> OutputManifest:
        """Collect outputs with caps, optionally saving them as artifacts, and record them in metadata."""
        ...


@runtime_checkable
class FileReader(Protocol):
    """A workspace file opened for reading (:meth:`SupportsFileStreams.open_reader`)."""

    @property
    def size(self) -> int:
        """The file's size when it was opened: what :meth:`chunks` yields in all."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The content in bounded chunks, read as they are asked for (never the whole file at once); the file
        is closed when they end. A file that shrank meanwhile ends them with ``BackendError``. Call it once."""
        ...

    async def aclose(self) -> None:
        """Close the file, read or not. Idempotent."""
        ...


@runtime_checkable
class SupportsFileStreams(Protocol):
    """A :class:`WorkspaceFS` that moves one file at a time as a stream of chunks, holding one chunk in memory
    whatever the file's size: what ``execspace serve``'s file API runs on. Paths, confinement and the file rule
    are those of ``read_file`` and ``put_files``."""

    async def open_reader(self, ws: Workspace, path: str) -> FileReader:
        """Open the file at ``path``; raise as ``read_file`` does (``PathDenied`` for anything but a regular file
        with one link, such as a FIFO, socket or device, naming what it is; ``FileNotFoundError``) before
        anything is read."""
        ...

    async def write_stream(
        self, ws: Workspace, path: str, chunks: AsyncIterable[bytes], *, max_bytes: int, mode: int = 0o644
    ) -> int:
        """Write the chunks to a new file beside ``path`` (created ``O_EXCL``) as they come, then rename it over
        ``path``; return the size written. Past ``max_bytes`` raise ``LimitExceeded`` without asking for another
        chunk. On any error, the chunks' own included, the new file is removed and ``path`` is left as it was."""
        ...


@runtime_checkable
class SupportsFileMetadata(Protocol):
    """A :class:`WorkspaceFS` that keeps metadata with files: string pairs stored with a file or directory (on a
    host, extended attributes in the ``user.e2b.`` namespace, as E2B's envd stores them: a program in the workspace
    sees them and may set them too). They stay with the entry through a rename and go with it; a file written anew
    (``put_files``, ``write_stream``) starts with none. Keys and values follow
    :func:`execspace.workspace.xattrs.check_file_metadata` (envd's rules). Paths, confinement and the file rule
    are those of ``stat`` (reading) and ``put_files`` (writing); a link is never followed and holds none.
    Where the filesystem keeps no metadata, reads give none and writes say so."""

    async def read_metadata(self, ws: Workspace, paths: Sequence[str]) -> builtins.list[dict[str, str]]:
        """The metadata of the entry at each path, in order: ``{}`` where it has none, where nothing is there
        (any more) or where the entry is a link or holds none. A pair whose key or value is not UTF-8 (a program
        set it) is left out."""
        ...

    async def write_metadata(self, ws: Workspace, path: str, metadata: Mapping[str, str]) -> bool:
        """Make ``metadata`` the whole metadata of the file or directory at ``path``: keys it lacks are removed
        (``{}`` clears it). False, and nothing written, where the entry or its filesystem keeps none.
        ``UsageError`` for a pair the rules refuse (before anything is written), ``PathDenied`` where the
        program may not write the entry, ``FileNotFoundError`` if nothing is there; ``OSError`` ``ENOSPC`` when
        the filesystem has no room for it."""
        ...


@runtime_checkable
class ProgramHandle(Protocol):
    """A started program: stream its output, feed stdin, signal or kill it, wait for its result.

    Usable as an async context manager; leaving the block kills and reaps the program. A program started
    with ``start_program`` outlives the call that started it: it runs until it exits, is killed, or its
    workspace is cleaned up, and ``runner.get_program`` hands out another handle to it meanwhile.
    """

    @property
    def pid(self) -> int | None:
        """The id ``ProgramInfo.pid`` reports (None before the program started)."""
        ...

    @property
    def info(self) -> ProgramInfo: ...

    def stream(self) -> AsyncIterator[OutputChunk]:
        """Yield output chunks as they arrive, until both streams close: the program's main reader, which
        paces the program (a slow reader pauses its pipes). Call it once."""
        ...

    def attach(self, *, from_start: bool = True) -> AsyncIterator[OutputChunk]:
        """Another reader of the output, any number at once: from the start (as much as the backend kept,
        at least the first MiB) or only what comes from now, until the program's output ends. "Now" is this
        call: the reader is registered before it returns, not when it is first iterated.

        An attached reader never slows the program: one that falls more than a bounded buffer behind ends
        with ``BackendError`` (attach again, from now)."""
        ...

    async def write_stdin(self, data: bytes | str) -> None:
        """Write to the program's stdin (its terminal with a pty); ``UsageError`` once stdin is closed."""
        ...

    async def close_stdin(self) -> None:
        """Close stdin (end of file for the program; with a pty, the terminal's EOF character). Idempotent."""
        ...

    async def signal(self, sig: int) -> None:
        """Send signal ``sig`` to the program's process group; nothing once it has exited."""
        ...

    async def resize(self, size: PtySize) -> None:
        """Resize the program's terminal (the program gets SIGWINCH); ``UsageError`` without a pty."""
        ...

    async def kill(self) -> None:
        """Kill the whole program tree (TERM, then KILL after a grace period)."""
        ...

    async def wait(self) -> RunResult:
        """Wait for exit (or the deadline) and return the result with the output so far."""
        ...

    async def __aenter__(self) -> ProgramHandle: ...

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None: ...


@runtime_checkable
class ProgramRunner(Protocol):
    """Runs programs inside workspaces."""

    async def run_program(self, ws: Workspace, spec: RunProgramSpec) -> RunResult:
        """Run to completion or deadline. Raise ``CapabilityError`` before running if the
        spec asks for what the backend cannot enforce. Timeouts are reported in the
        result (``timed_out``), never by leaving processes behind."""
        ...

    async def start_program(self, ws: Workspace, spec: RunProgramSpec) -> ProgramHandle:
        """Start a program for streaming/interactive use (``spec.tag`` names it, ``spec.pty`` gives it a
        terminal); it runs until it exits, is killed or the workspace is cleaned up."""
        ...

    async def list_programs(self, ws: Workspace) -> list[ProgramInfo]:
        """The programs started in ``ws`` with ``start_program`` that are still running, oldest first."""
        ...

    async def get_program(self, ws: Workspace, key: int | str) -> ProgramHandle:
        """A handle to a running program of ``ws``, by pid (int) or tag (str; the newest with that tag).

        Raises:
            ProgramNotFound: no program of ``ws`` with that pid or tag is running.
        """
        ...


@runtime_checkable
class Engine(Protocol):
    """One backend: manager + fs + runner + an honest capability statement."""

    @property
    def name(self) -> str: ...

    @property
    def manager(self) -> WorkspaceManager: ...

    @property
    def fs(self) -> WorkspaceFS: ...

    @property
    def runner(self) -> ProgramRunner: ...

    def describe(self) -> Capabilities:
        """What the engine enforces and has (programs, kernels, forks…): the conformance kit runs its sections on
        what this says."""
        ...

    async def aclose(self) -> None:
        """Release everything the engine holds; idempotent. Afterwards ``manager``, ``fs`` and ``runner`` raise
        ``UsageError``."""
        ...


@runtime_checkable
class Kernels(Protocol):
    """Stateful kernels, one per workspace, that run code blocks of their language (``engine.kernels``)."""

    def handles(self, tag: str) -> bool:
        """Whether a code block with fence tag ``tag`` runs in a kernel (else it runs as a program)."""
        ...

    async def run_block(
        self,
        ws: Workspace,
        block: CodeBlock,
        index: int,
        *,
        timeout: float | None,  # noqa: ASYNC109 - a deadline for the kernel, not for our task
        limits: ResourceLimits,
    ) -> tuple[BlockResult, str]:
        """Run one block in ``ws``'s kernel: its result and the text the executor shows for it."""
        ...


@runtime_checkable
class CellKernels(Kernels, Protocol):
    """Kernels a caller drives cell by cell, as a notebook does: ``engine.kernels`` of the ``jupyter`` and ``e2b``
    backends, so that code written for one runs on the other."""

    async def execute(
        self,
        ws: Workspace,
        code: str,
        *,
        timeout: float | None = ...,  # noqa: ASYNC109 - a deadline for the cell, not for our task
        output_bytes: int | None = ...,
    ) -> CellResult:
        """Run ``code`` in the workspace's kernel (started on first use), keeping its state for the next cell; rich
        outputs are saved under ``out/`` and named in the result."""
        ...

    async def shutdown(self, ws: Workspace) -> None:
        """Stop the workspace's kernel: its state is lost, the next cell starts a fresh one. Idempotent."""
        ...


@runtime_checkable
class SupportsKernels(Protocol):
    """An engine with stateful kernels; its ``describe().kernels`` says what they offer."""

    @property
    def kernels(self) -> Kernels: ...


@runtime_checkable
class SupportsFreezing(Protocol):
    """A program runner that can hold every program it runs in a workspace still for a while (a cgroup freezer, or
    ``SIGSTOP`` sent again to whatever wakes: :mod:`execspace.process.freezing`): they keep their memory, and
    continue where they were when the block ends, also when it raises."""

    def frozen(self, ws: Workspace) -> contextlib.AbstractAsyncContextManager[None]:
        """The workspace's programs, and their descendants, held still for the block; the block may outlive the
        task that entered it (``execspace serve`` holds it while a sandbox is paused).

        Raises:
            FreezeFailed: (on entering) they could not all be held (they keep waking each other or forking, and only
                signals hold them); none is, every one stopped on the way continues.
        """
        ...


@runtime_checkable
class SupportsCpuUsage(Protocol):
    """A program runner that tells how much CPU the programs it runs in a workspace have used: what ``execspace
    serve`` compares between two readings to pause a sandbox whose programs do nothing (docs/operations.md "Idle
    pausing"). Cheap enough to read every second for every workspace: one file per cgroup where the backend counts
    a workspace's processes together (the sandbox backend's, as root), else a walk of its processes in ``/proc``."""

    def cpu_seconds(self, ws: Workspace) -> float:
        """The user and system CPU seconds the workspace's programs and their descendants have used so far. A
        counter: it grows while they work; summed over processes (no cgroup), it also drops when one of them ends
        (that is a change too)."""
        ...


@runtime_checkable
class SupportsSnapshots(Protocol):
    """A workspace manager that snapshots, forks and restores its workspaces' files (never their processes or
    kernels); the engine's ``describe().fork`` says how (``"cow"`` or ``"copy"``)."""

    async def snapshot(self, ws: Workspace, name: str | None = None) -> Snapshot:
        """Freeze the workspace's files now.

        Raises:
            InvalidSpec: the name is taken or malformed, or ``ws`` is not this manager's.
            LimitExceeded: the tree is too deep or too large to copy (the message names the limit); nothing is kept.
            FreezeFailed: its programs could not be held still for the copy; nothing is kept.
        """
        ...

    async def fork(
        self,
        source: Workspace | Snapshot | str,
        count: int = 1,
        ids: Sequence[str] | None = None,
        *,
        policy: WorkspacePolicy | None = None,
    ) -> builtins.list[Workspace]:
        """``count`` new workspaces starting from ``source``'s files (a workspace, or a snapshot's handle, id or
        name; 1..100 of them; ``ids`` names them).

        Raises:
            InvalidSpec: a bad count, duplicate or existing ids.
            SnapshotNotFound: ``source`` is a snapshot that was removed.
            LimitExceeded: a workspace ``source`` is too deep or too large to copy; no fork is made.
            FreezeFailed: a workspace ``source``'s programs could not be held still for the copy; no fork is made.
        """
        ...

    async def restore(self, ws: Workspace, snapshot: Snapshot | str) -> None:
        """Bring the workspace's files back to ``snapshot`` (a handle, id or name); its programs are stopped."""
        ...

    async def list_snapshots(self) -> builtins.list[Snapshot]: ...

    async def remove_snapshot(self, snapshot: Snapshot | str) -> None: ...
