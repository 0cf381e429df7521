"""WorkspaceFS for backends whose workspaces are host directories (local, sandbox)."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import stat
import threading
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from wcmatch import glob as wglob

from ..audit import AuditSink
from ..errors import BackendError, InputError, LimitExceeded, PathDenied, UsageError, WorkspaceFileNotFound
from ..mime import SNIFF_BYTES, guess_mime
from ..models import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_FILES,
    DEFAULT_MAX_TOTAL_BYTES,
    File,
    FileEntry,
    FileKind,
    PutFile,
    Workspace,
)
from ..tracing import NO_TRACER, Tracer
from .confine import ConfinedRoot, Entry, ProgramUser, TempFile, split_relpath
from .hostroots import HostSource, walk_tree
from .layers import own_changes
from .layout import METADATA_FILE
from .metadata import is_metadata_temp
from .programpaths import checked_relative, outside_workspace, workspace_relative, workspace_relatives
from .staging import WorkspaceFSBase, checked_depth
from .xattrs import check_file_metadata

if TYPE_CHECKING:
    from ..artifacts import ArtifactService

__all__ = [
    "GLOB_FLAGS",
    "AccessHook",
    "FileStream",
    "HostWorkspaceFS",
    "entry_of",
    "glob_base",
    "normalize_globs",
]

#: A backend's file rule, run before each access: ``(ws, path, mode)`` raises ``PathDenied`` when
#: ``mode`` is not allowed at ``path`` (workspace-relative, or an absolute host path being read).
AccessHook = Callable[[Workspace, str, Literal["read", "write"]], None]

#: Bytes a stream reads or writes per worker-thread call: what one file transfer holds in memory at a time.
STREAM_CHUNK = 256 * 1024

#: ``**`` crosses directories, dotfiles match, no brace/extglob surprises.
GLOB_FLAGS = wglob.GLOBSTAR | wglob.DOTGLOB | wglob.NEGATE

_VAR_PREFIXES = {
    "$WORKSPACE_DIR": "",
    "$WORK_DIR": "work",
    "$OUTPUT_DIR": "out",
    "$SKILLS_DIR": "skills",
    "$RUN_DIR": "runs",
}


def normalize_globs(patterns: Sequence[str]) -> list[str]:
    """Trim patterns, drop blanks, and rewrite a leading ``$OUTPUT_DIR``-style variable
    (also ``${OUTPUT_DIR}``) into the workspace-relative directory, on a word boundary."""
    out: list[str] = []
    for raw in patterns:
        p = raw.strip()
        if not p:
            continue
        if p.startswith("${"):
            end = p.find("}")
            if end > 0:
                p = "$" + p[2:end] + p[end + 1 :]
        for var, rel in _VAR_PREFIXES.items():
            if p == var or p.startswith(var + "/"):
                tail = p[len(var) :].lstrip("/")
                p = f"{rel}/{tail}" if rel and tail else (rel or tail)
                break
        if p.startswith("./"):
            p = p[2:]
        out.append(p)
    return out


def collect_globs(patterns: Sequence[str]) -> list[str]:
    """:func:`normalize_globs`, refusing a pattern that is absolute or climbs out of the workspace."""
    globs = normalize_globs(patterns)
    for g in globs:
        if g.startswith("/") or ".." in g.split("/"):
            raise PathDenied(g, "collect patterns must be relative to the workspace and stay inside it")
    return globs


def walk_starts(globs: Sequence[str]) -> list[tuple[str, ...]]:
    """The directories a walk must start from to see every match of the (non-negated) globs."""
    starts = sorted({tuple(glob_base(g)) for g in globs if not g.startswith("!")})
    # walking a parent covers its children: drop bases nested in another base
    return [s for s in starts if not any(s[: len(o)] == o and s != o for o in starts)]


def glob_base(pattern: str) -> list[str]:
    """The literal leading directories of a glob: where a walk must start."""
    parts = pattern.split("/")[:-1]
    base: list[str] = []
    for part in parts:
        if wglob.is_magic(part, flags=GLOB_FLAGS) or part in ("", ".", ".."):
            break
        base.append(part)
    return base


def entry_of(path: str, st: os.stat_result, link_target: str | None = None) -> FileEntry:
    """The :class:`FileEntry` of an ``lstat`` result."""
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISREG(st.st_mode):
        return FileEntry(path, st.st_size, st.st_mtime, FileKind.FILE, mode)
    if stat.S_ISLNK(st.st_mode):
        return FileEntry(path, st.st_size, st.st_mtime, FileKind.SYMLINK, mode, link_target)
    if stat.S_ISDIR(st.st_mode):
        return FileEntry(path, st.st_size, st.st_mtime, FileKind.DIR, mode)
    return FileEntry(path, 0, st.st_mtime, FileKind.OTHER, mode)


class ProgramView(Protocol):
    """The file operations at absolute paths outside a workspace (and its program binds) as its programs see them,
    served where they are by a backend whose programs see more than their workspace (the sandbox: its system
    directories and grants, through its file agent run as a program); with the programs' permissions."""

    def shows(self, path: str) -> bool:
        """Whether the absolute ``path`` is the view's even where a program bind holds it (a host grant under
        ``/tmp`` is mounted over the workspace's ``tmp/``)."""
        ...

    async def read_file(self, ws: Workspace, path: str, *, max_bytes: int | None = None) -> File: ...

    async def put_files(self, ws: Workspace, files: Sequence[PutFile]) -> None: ...

    async def stat(self, ws: Workspace, path: str) -> FileEntry: ...

    async def list_dir(self, ws: Workspace, path: str, *, depth: int = 1) -> builtins.list[FileEntry]: ...

    async def make_dir(self, ws: Workspace, path: str) -> None: ...

    async def remove(self, ws: Workspace, path: str) -> None: ...


class HostWorkspaceFS(WorkspaceFSBase):
    """File operations on host-directory workspaces, confined with fd-relative walks.

    ``host_roots`` are the host directories ``host://`` inputs and ``stage_directory``
    may read from; nothing else on the host is reachable through this object.
    ``access`` is the backend's file rule (the sandbox's policy, the container's protected
    paths): writes it refuses raise ``PathDenied`` before anything is written, reads it
    refuses raise too, and ``collect``, ``list`` and staged host trees skip what it hides.
    The programs' own mode bits are honoured too (``programs_read_all``: they read every
    file of theirs, whatever its mode).
    ``remove`` and ``rename`` of a directory check every entry in it, so that a tree
    holding a path the rule keeps is refused whole, before anything moves.
    ``elsewhere``: the backend's way to the absolute paths outside a workspace (and its program
    binds) that its programs see (:class:`ProgramView`: the sandbox's system directories and
    grants); without it such a path is ``PathDenied``.
    """

    def __init__(
        self,
        artifacts: ArtifactService | None = None,
        host_roots: Sequence[Path | str] = (),
        *,
        owner: Callable[[Workspace], tuple[int, int] | None] | None = None,
        access: AccessHook | None = None,
        programs_read_all: bool = False,
        elsewhere: ProgramView | None = None,
        tracer: Tracer = NO_TRACER,
        audit: AuditSink | None = None,
    ) -> None:
        super().__init__(artifacts, host_roots, tracer=tracer, audit=audit)
        self._access = access
        self._read_all = programs_read_all
        self._elsewhere = elsewhere
        # uid/gid for what we create, per workspace (the sandbox uid when we run as root)
        self._owner = owner

    def owner(self, ws: Workspace) -> tuple[int, int] | None:
        return self._owner(ws) if self._owner is not None else None

    def program_user(self, ws: Workspace, path: str) -> ProgramUser | None:
        """Whose mode bits ``read_file`` and ``put_files`` honour at ``path``: the uid the workspace's programs
        run as (the one we give files to), else ours; None for the workspace's record, which is ours."""
        if split_relpath(path) == [METADATA_FILE]:
            return None
        owner = self.owner(ws)
        return ProgramUser(os.geteuid() if owner is None else owner[0], self._read_all)

    def check(self, ws: Workspace, path: str, mode: Literal["read", "write"]) -> None:
        """Raise ``PathDenied`` if the backend's file rule forbids ``mode`` at ``path``."""
        if self._access is not None:
            self._access(ws, path, mode)

    def _readable(self, ws: Workspace) -> Callable[[str], bool]:
        def readable(path: str) -> bool:
            try:
                self.check(ws, path, "read")
            except PathDenied:
                return False
            return True

        return readable

    @staticmethod
    def _root(ws: Workspace) -> str:
        if ws.host_path is None:
            raise UsageError(f"workspace {ws.id!r} has no host path; it belongs to backend {ws.backend!r}")
        return str(ws.host_path)

    # -- primitives ------------------------------------------------------------------

    def _outside(self, ws: Workspace, path: str) -> ProgramView | None:
        """The way to ``path`` when it is outside the workspace as its programs see it, and the backend has one."""
        view = self._elsewhere
        return view if view is not None and (outside_workspace(ws, path) or view.shows(path)) else None

    async def put_files(self, ws: Workspace, files: Sequence[PutFile]) -> None:
        root = self._root(ws)
        elsewhere = [f for f in files if self._outside(ws, f.path) is not None]
        if elsewhere and self._elsewhere is not None:
            await self.put_files(ws, [f for f in files if self._outside(ws, f.path) is None])
            await self._elsewhere.put_files(ws, elsewhere)
            self._wrote(ws, [(f.path, len(f.data)) for f in elsewhere])
            return None
        files = [replace(f, path=workspace_relative(ws, f.path)) for f in files]
        for f in files:
            split_relpath(f.path)  # refuse bad paths before writing anything
            self.check(ws, f.path, "write")

        def write_all() -> None:
            with ConfinedRoot(root, self.owner(ws)) as cr:
                writers = ((f.path, self.program_user(ws, f.path)) for f in files)
                cr.refuse_unwritable([(path, w) for path, w in writers if w is not None])  # all before any write
                for f in files:
                    cr.write_file(f.path, f.data, f.mode)

        await asyncio.to_thread(write_all)
        self._wrote(ws, [(f.path, len(f.data)) for f in files])

    async def read_file(self, ws: Workspace, path: str, *, max_bytes: int | None = None) -> File:
        root = self._root(ws)
        if (view := self._outside(ws, path)) is not None:
            return await view.read_file(ws, path, max_bytes=max_bytes)
        path = workspace_relative(ws, path)
        self.check(ws, path, "read")

        def read() -> File:
            with ConfinedRoot(root) as cr, _named_if_missing(ws, path):
                data, size = cr.read_file(path, max_bytes, self.program_user(ws, path))
            return File(path, data, guess_mime(path, data[:SNIFF_BYTES]), size, truncated=len(data) < size)

        return await asyncio.to_thread(read)

    async def open_reader(self, ws: Workspace, path: str) -> FileStream:
        """The file at ``path``, opened as :meth:`read_file` opens it, to be read a chunk at a time."""
        root = self._root(ws)
        path = workspace_relative(ws, path)
        self.check(ws, path, "read")

        def open_() -> FileStream:
            with ConfinedRoot(root) as cr, _named_if_missing(ws, path):
                fd, st = cr.open_readable(path, self.program_user(ws, path))
            return FileStream(fd, st.st_size)

        return await asyncio.to_thread(open_)

    async def write_stream(
        self, ws: Workspace, path: str, chunks: AsyncIterable[bytes], *, max_bytes: int, mode: int = 0o644
    ) -> int:
        """Write the chunks, as they come, to a new file beside ``path`` that replaces it once they end; past
        ``max_bytes`` (``LimitExceeded``) or on any error no more is taken and nothing at ``path`` changes. The
        confinement, the file rule and the program's mode bits are those of :meth:`put_files`."""
        root = self._root(ws)
        path = workspace_relative(ws, path)
        split_relpath(path)
        self.check(ws, path, "write")
        writer = self.program_user(ws, path)

        def open_temp() -> TempFile:
            with ConfinedRoot(root, self.owner(ws)) as cr:
                if writer is not None:
                    cr.refuse_unwritable([(path, writer)])
                return cr.open_temp(path, mode)

        temp = await asyncio.to_thread(open_temp)
        try:
            size = await _pump(chunks, temp, max_bytes)
            await asyncio.to_thread(temp.commit)
        finally:
            temp.discard()  # here, not in a thread: a cancelled task must not leave it behind
        self._wrote(ws, [(path, size)])
        return size

    async def collect(
        self,
        ws: Workspace,
        patterns: Sequence[str],
        *,
        max_files: int = DEFAULT_MAX_FILES,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    ) -> list[File]:
        files, _ = await self.collect_with_limits(
            ws, patterns, max_files=max_files, max_file_bytes=max_file_bytes, max_total_bytes=max_total_bytes
        )
        return files

    async def collect_with_limits(
        self,
        ws: Workspace,
        patterns: Sequence[str],
        *,
        max_files: int = DEFAULT_MAX_FILES,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    ) -> tuple[list[File], bool]:
        """Like :meth:`collect`, also telling whether a cap cut the result short."""
        root = self._root(ws)
        globs = collect_globs(workspace_relatives(ws, patterns))
        limits = (max_files, max_file_bytes, max_total_bytes)
        return await asyncio.to_thread(_collect, root, globs, *limits, self._readable(ws))

    async def list(self, ws: Workspace, patterns: Sequence[str]) -> list[FileEntry]:
        """Every entry matching the globs, of any kind, without reading content; symlinks are listed,
        never followed, and directories (kind ``dir``, their own size) are listed and walked into."""
        root = self._root(ws)
        globs = collect_globs(workspace_relatives(ws, patterns))
        readable = self._readable(ws)

        def walk() -> list[FileEntry]:
            with ConfinedRoot(root) as cr:
                return [entry_of(rel, st) for rel, st in _listed(cr, globs) if readable(rel)]

        return await asyncio.to_thread(walk)

    async def list_dir(self, ws: Workspace, path: str, *, depth: int = 1) -> builtins.list[FileEntry]:
        """One walk below ``path`` that goes no deeper than ``depth`` (no glob is matched)."""
        root = self._root(ws)
        if (view := self._outside(ws, path)) is not None:
            return await view.list_dir(ws, path, depth=checked_depth(depth))
        rel = checked_relative(ws, path)
        levels = checked_depth(depth)
        readable = self._readable(ws)

        def walk() -> builtins.list[FileEntry]:
            with ConfinedRoot(root) as cr:
                found = cr.scan(split_relpath(rel), descend=levels)
                return [entry_of(r, st) for r, st, _ in found if readable(r) and ("/" in r or not is_metadata_temp(r))]

        return await asyncio.to_thread(walk)

    async def stat(self, ws: Workspace, path: str) -> FileEntry:
        root = self._root(ws)
        if (view := self._outside(ws, path)) is not None:
            return await view.stat(ws, path)
        rel = checked_relative(ws, path)
        self.check(ws, rel, "read")

        def lstat() -> FileEntry:
            with ConfinedRoot(root) as cr:
                st = cr.lstat(rel)
                return entry_of(rel, st, cr.read_link(rel) if stat.S_ISLNK(st.st_mode) else None)

        return await asyncio.to_thread(lstat)

    async def read_metadata(self, ws: Workspace, paths: Sequence[str]) -> builtins.list[dict[str, str]]:
        """:class:`~execspace.protocols.SupportsFileMetadata`: each entry's ``user.e2b.`` attributes."""
        root = self._root(ws)
        rels = [checked_relative(ws, p) for p in paths]
        for rel in rels:
            self.check(ws, rel, "read")

        def read() -> builtins.list[dict[str, str]]:
            with ConfinedRoot(root) as cr:
                return cr.metadata_of(rels)

        return await asyncio.to_thread(read)

    async def write_metadata(self, ws: Workspace, path: str, metadata: Mapping[str, str]) -> bool:
        """:class:`~execspace.protocols.SupportsFileMetadata`: the entry's ``user.e2b.`` attributes replaced,
        if the program may write it."""
        check_file_metadata(metadata)
        root = self._root(ws)
        rel = checked_relative(ws, path)
        self.check(ws, rel, "write")
        writer = self.program_user(ws, rel)

        def write() -> bool:
            with ConfinedRoot(root) as cr:
                return cr.set_metadata(rel, metadata, writer)

        return await asyncio.to_thread(write)

    async def make_dir(self, ws: Workspace, path: str) -> None:
        root = self._root(ws)
        if (view := self._outside(ws, path)) is not None:
            return await view.make_dir(ws, path)
        rel = checked_relative(ws, path)
        self.check(ws, rel, "write")

        def mkdir() -> None:
            with ConfinedRoot(root, self.owner(ws)) as cr:
                cr.make_dir(rel)

        await asyncio.to_thread(mkdir)

    async def rename(self, ws: Workspace, src: str, dst: str) -> None:
        root = self._root(ws)
        src, dst = checked_relative(ws, src), checked_relative(ws, dst)
        self.check(ws, src, "write")
        self.check(ws, dst, "write")

        def move() -> None:
            with ConfinedRoot(root, self.owner(ws)) as cr:
                for rel in self._tree_below(cr, src):
                    self.check(ws, rel, "write")
                    self.check(ws, dst + rel[len(src) :], "write")
                cr.rename(src, dst)

        await asyncio.to_thread(move)
        self._renamed(ws, src, dst)

    def _tree_below(self, cr: ConfinedRoot, path: str) -> Iterator[str]:
        """What a rule must allow before the tree at ``path`` goes (nothing to check without a rule)."""
        if self._access is None:
            return
        for rel, _, unreadable in cr.scan(split_relpath(path)):
            if unreadable:
                raise PathDenied(rel, "a directory in the tree cannot be read, so the file rule cannot be checked")
            yield rel

    async def stage_directory(self, ws: Workspace, src: Path, dest: str, *, read_only: bool = False) -> None:
        src = Path(src)
        if not src.is_absolute():
            raise PathDenied(str(src), "stage_directory needs an absolute host path")
        root = self._root(ws)
        dest = workspace_relative(ws, dest)

        def rules(host_src: str, target: str) -> bool:
            """Copy this entry? Host entries the rule hides are skipped; refused targets raise."""
            try:
                self.check(ws, host_src, "read")
            except PathDenied:
                return False
            self.check(ws, target, "write")
            return True

        def stage() -> None:
            with self.roots.open(src) as source:
                if not source.is_dir:
                    raise InputError(f"stage_directory needs a directory, and {src} is a file")
                self.check(ws, str(source.path), "read")
                self.check(ws, dest, "write")
                _copy_tree(source, root, dest, read_only, self.owner(ws), rules)

        await asyncio.to_thread(stage)

    async def remove(self, ws: Workspace, path: str) -> None:
        root = self._root(ws)
        if (view := self._outside(ws, path)) is not None:
            await view.remove(ws, path)
            self._removed(ws, path)
            return None
        rel = checked_relative(ws, path)
        self.check(ws, rel, "write")

        def rm() -> None:
            with ConfinedRoot(root) as cr:
                for below in self._tree_below(cr, rel):
                    self.check(ws, below, "write")
                cr.remove(rel)

        await asyncio.to_thread(rm)
        self._removed(ws, rel)

    def check_host_path(self, src: Path) -> Path:
        """Return the real path of ``src`` if it lies inside an allowed host root."""
        return self.roots.check(src)

    async def link_host(self, ws: Workspace, src: Path, dest: str) -> None:
        """Make ``dest`` a symlink to the allowed host path ``src`` (mode='link')."""
        real = self.check_host_path(src)
        dest = workspace_relative(ws, dest)
        self.check(ws, str(real), "read")
        self.check(ws, dest, "write")
        root = self._root(ws)

        def link() -> None:
            with ConfinedRoot(root, self.owner(ws)) as cr:
                cr.symlink(str(real), dest)

        await asyncio.to_thread(link)

    async def disk_usage(self, ws: Workspace) -> int:
        """Bytes the workspace's own files take (a copy-on-write fork's changes, not the snapshot it shares)."""
        root = self._root(ws)

        def du() -> int:
            with ConfinedRoot(str(own_changes(Path(root)))) as cr:
                return cr.disk_usage()

        return await asyncio.to_thread(du)


class FileStream:
    """An opened workspace file read a chunk at a time, up to the size it had when opened: memory stays one chunk
    whatever the file's size (a sparse one of a terabyte too). A file that shrinks meanwhile ends the stream with
    ``BackendError``; one that grows is read only up to that size."""

    def __init__(self, fd: int, size: int) -> None:
        self.size = size
        self._fd = fd
        self._lock = threading.Lock()  # a read on a worker thread and a close take turns

    async def chunks(self) -> AsyncIterator[bytes]:
        """The content, in chunks of at most :data:`STREAM_CHUNK` bytes; the file is closed when they end."""
        offset = 0
        try:
            while offset < self.size:
                data = await asyncio.to_thread(self._read, offset, min(STREAM_CHUNK, self.size - offset))
                if not data:
                    raise BackendError(f"the file shrank to {offset} bytes while it was read ({self.size} expected)")
                offset += len(data)
                yield data
        finally:
            self.close()

    def _read(self, offset: int, size: int) -> bytes:
        with self._lock:
            if self._fd < 0:
                raise BackendError("the file was closed while it was read")
            return os.pread(self._fd, size, offset)  # no shared offset: reads never depend on each other

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    async def aclose(self) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


async def _pump(chunks: AsyncIterable[bytes], temp: TempFile, max_bytes: int) -> int:
    """Write ``chunks`` into ``temp`` a :data:`STREAM_CHUNK` batch per worker-thread call; the size written.
    ``LimitExceeded`` as soon as more than ``max_bytes`` came, without asking for another chunk."""
    size = 0
    batch = bytearray()
    async for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise LimitExceeded(f"the file is larger than {max_bytes} bytes")
        batch += chunk
        if len(batch) >= STREAM_CHUNK:
            await asyncio.to_thread(temp.write, batch)
            batch = bytearray()
    if batch:
        await asyncio.to_thread(temp.write, batch)
    return size


@contextlib.contextmanager
def _named_if_missing(ws: Workspace, path: str) -> Iterator[None]:
    """A file (or a directory on its way) that is not there is :class:`~execspace.errors.WorkspaceFileNotFound`,
    naming the path and the workspace: a bare ``FileNotFoundError`` says neither."""
    try:
        yield
    except FileNotFoundError:
        raise WorkspaceFileNotFound(path, f"{ws.id!r} ({ws.host_path or ws.path})") from None


def _matching(cr: ConfinedRoot, globs: list[str]) -> Iterator[Entry]:
    seen: set[str] = set()
    for start in walk_starts(globs):
        for entry in cr.walk(list(start)):
            if entry.relpath in seen:
                continue
            if "/" not in entry.relpath and (is_metadata_temp(entry.relpath)):
                continue
            # a directory we may not read may hold matching files: the caller hears of it
            if entry.unreadable or wglob.globmatch(entry.relpath, globs, flags=GLOB_FLAGS):
                seen.add(entry.relpath)
                yield entry


def _listed(cr: ConfinedRoot, globs: list[str]) -> Iterator[tuple[str, os.stat_result]]:
    seen: set[str] = set()
    for start in walk_starts(globs):
        for rel, st, _ in cr.scan(list(start), descend=_levels(globs, start)):
            if rel in seen or ("/" not in rel and is_metadata_temp(rel)):
                continue
            if wglob.globmatch(rel, globs, flags=GLOB_FLAGS):
                seen.add(rel)
                yield rel, st


def _levels(globs: list[str], start: tuple[str, ...]) -> int | None:
    """How many levels below ``start`` a match of ``globs`` can be (None: any depth, a ``**`` is among them), so
    that a walk for them goes no deeper. A pattern's ``/`` count bounds every expansion of it (braces and extended
    globs only take text away)."""
    levels = 0
    for g in globs:
        parts = g.split("/")
        if g.startswith("!") or parts[: len(start)] != list(start):
            continue  # a negation narrows, and another start's pattern is walked from there
        if "**" in g:
            return None
        levels = max(levels, len(parts) - len(start))
    return levels or None


_UNREADABLE = "unreadable (permission denied: the program removed read permission)"
_UNREADABLE_DIR = "unreadable directory (permission denied: the program removed access); its files were not collected"


def _collect(
    root: str,
    globs: list[str],
    max_files: int,
    max_file_bytes: int,
    max_total_bytes: int,
    readable: Callable[[str], bool],
) -> tuple[list[File], bool]:
    files: list[File] = []
    budget = max_total_bytes
    limits_hit = False
    with ConfinedRoot(root) as cr:
        for entry in _matching(cr, globs):
            if not readable(entry.relpath):
                continue  # hidden by the backend's file rule: as if absent
            # a cap is "hit" only when another matching file is left out, not when it is met exactly
            if len(files) >= max_files or budget <= 0:
                limits_hit = True
                break
            if entry.unreadable:
                files.append(File(entry.relpath, b"", "inode/directory", 0, skipped=_UNREADABLE_DIR))
                continue
            if entry.nlink > 1:
                continue  # may alias a host file; read_file would refuse it too
            cap = min(max_file_bytes, budget)
            try:
                data, size = cr.read_file(entry.relpath, cap)
            except (PathDenied, FileNotFoundError):
                continue  # swapped for a link or removed since the walk: skip, never follow
            except PermissionError:  # the program's chmod: report it, lose nothing else
                files.append(File(entry.relpath, b"", "application/octet-stream", entry.size, skipped=_UNREADABLE))
                continue
            truncated = len(data) < size
            limits_hit = limits_hit or truncated
            budget -= len(data)
            files.append(File(entry.relpath, data, guess_mime(entry.relpath, data[:SNIFF_BYTES]), size, truncated))
    return files, limits_hit


def _copy_tree(
    source: HostSource,
    root: str,
    dest: str,
    read_only: bool,
    owner: tuple[int, int] | None,
    rules: Callable[[str, str], bool],
) -> None:
    """Copy the opened host directory ``source`` to workspace path ``dest``; symlinks in it are skipped,
    and so are entries ``rules(host_path, target)`` declines."""
    dest_parts = split_relpath(dest)
    count = 0

    def keep(rel: tuple[str, ...]) -> bool:
        return rules(os.path.join(source.path, *rel), "/".join([*dest_parts, *rel]))

    with ConfinedRoot(root, owner) as cr:
        os.close(cr.open_dir(dest_parts, create=True))
        for entry in walk_tree(source.fd, keep):
            target = "/".join([*dest_parts, *entry.rel])
            if entry.fd is None:
                os.close(cr.open_dir(split_relpath(target), create=True))
                continue
            count += 1
            if count > 1_000_000:
                raise LimitExceeded(f"{source.path} has more than 1,000,000 files; stage a smaller tree")
            cr.write_file(target, entry.fd, entry.st.st_mode & (0o555 if read_only else 0o755))
