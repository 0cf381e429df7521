"""File access confined to a workspace root, safe against what the program planted.

Every access walks from an open directory fd of the root, one component at a
time, with ``O_NOFOLLOW``: a symlink anywhere on the path is refused, and a
symlink swapped in after a check cannot redirect us because there is no
check-then-open gap. Writes go to a fresh temp file that is renamed into place,
so a hard link planted at the target is replaced, never written through. Reads
open with ``O_NONBLOCK`` (a FIFO cannot hang us), accept only regular files and
refuse files with more than one hard link (one may point at a host file). Walks and
removal are iterative and hold a bounded number of directory fds whatever the depth;
removal never resolves a path again (a directory swapped for a symlink costs the link).

All functions here are synchronous; callers batch them into one worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from ..errors import PathDenied
from . import xattrs
from .confinecore import (
    DIR_FLAGS,
    MAX_WALK_DEPTH,
    READ_FLAGS,
    copy_fd,
    create_temp,
    open_regular,
    refuse_dir,
    remove_tree,
    rename_path,
    scan_tree,
    seal_temp,
    split_relpath,
    step_dir,
    walk_tree,
)
from .treecopy import copy_tree

__all__ = [
    "MAX_WALK_DEPTH",
    "ConfinedRoot",
    "Entry",
    "ProgramUser",
    "TempFile",
    "remove_tree",
    "split_relpath",
]


@dataclass(frozen=True, slots=True)
class Entry:
    """A regular file found by a walk, or (``unreadable``) a directory the walk could not read: a program took
    its permissions away, and what it holds is unknown."""

    relpath: str
    size: int
    nlink: int
    unreadable: bool = False


@dataclass(frozen=True, slots=True)
class ProgramUser:
    """The uid a workspace's programs run as, whose own files the host-side file API reads and writes by their
    owner's mode bits: it may be root (for whom the kernel checks none) and replaces files by renaming (which a
    file's write bit does not stop), so a file the program made unreadable or read-only is checked here.
    Entries of other owners (the host's own records) keep the host's access: the program cannot chmod them."""

    uid: int
    reads_all: bool = False
    """It reads every file of its own whatever their mode (a machine sandbox's user holds ``CAP_DAC_READ_SEARCH``
    in its sandbox's user namespace)."""

    def may(self, st: os.stat_result, bit: int) -> bool:
        """Whether the program may ``bit`` (``stat.S_IRUSR`` read, ``stat.S_IWUSR`` write) its entry of ``st``."""
        if bit == stat.S_IRUSR and self.reads_all:
            return True
        return self.uid == 0 or st.st_uid != self.uid or bool(st.st_mode & bit)

    def refuse(self, path: str, st: os.stat_result, bit: int) -> None:
        """``PathDenied`` unless :meth:`may`."""
        if not self.may(st, bit):
            doing = "read" if bit == stat.S_IRUSR else "write"
            raise PathDenied(
                path,
                f"the workspace's programs (uid {self.uid}) may not {doing} it (mode {stat.filemode(st.st_mode)}); "
                "a program's chmod gives the permission back",
            )


class ConfinedRoot:
    """Operations on one workspace root through an open directory fd."""

    def __init__(self, root: str, owner: tuple[int, int] | None = None) -> None:
        # owner: uid/gid given to files and directories we create (the sandbox's uid when we run as root)
        self.owner = owner
        try:
            self._fd = os.open(root, DIR_FLAGS)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise PathDenied(root, f"workspace root cannot be opened safely ({exc.strerror})") from exc
        self.root = root

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ConfinedRoot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- directories ---------------------------------------------------------------

    def open_dir(self, parts: list[str], *, create: bool = False, display: str = "") -> int:
        """Open the directory ``parts`` below the root, creating missing ones if asked."""
        fd = os.dup(self._fd)
        try:
            for name in parts:
                fd = self._step(fd, name, create, display or "/".join(parts))
            return fd
        except BaseException:
            os.close(fd)
            raise

    def make_new_dir(self, parts: list[str]) -> None:
        """Create the directory ``parts`` below the root, whose name is new (``FileExistsError`` if it is not),
        and its missing parents: the last one is made, never opened (a run's directory, made for every run)."""
        fd = self.open_dir(parts[:-1], create=True, display="/".join(parts))
        try:
            os.mkdir(parts[-1], 0o755, dir_fd=fd)
            if self.owner is not None:
                # by name, not through a link: what a program may have swapped in since is not followed
                os.chown(parts[-1], *self.owner, dir_fd=fd, follow_symlinks=False)
        finally:
            os.close(fd)

    def _step(self, fd: int, name: str, create: bool, display: str) -> int:
        return step_dir(fd, name, create, display, self.owner)

    # -- ownership -----------------------------------------------------------------
    #
    # Every host-side chown of workspace entries is here, on an fd the walk opened: a program that swaps a
    # directory for a symlink between our check and our chown gets a refusal, never a chown through the link.

    def ensure_dir(self, parts: list[str]) -> None:
        """Create the directory ``parts`` (``[]``: the root) if missing and give it to ``owner`` if set."""
        fd = self.open_dir(parts, create=True)
        try:
            st = os.fstat(fd)
            # only when it changes: a chown through a copy-on-write fork's overlay copies the directory up
            if self.owner is not None and (st.st_uid, st.st_gid) != self.owner:
                os.fchown(fd, *self.owner)
        finally:
            os.close(fd)

    def root_uid(self) -> int:
        return os.fstat(self._fd).st_uid

    def take_over(self, old_uid: int) -> None:
        """Give every entry owned by ``old_uid`` on the root's filesystem (the root included) to ``owner``.

        Directories are reached by walking from the root again (never holding one fd per pending directory);
        one swapped for a symlink meanwhile is skipped. What another filesystem mounted or linked in holds
        is never changed.
        """
        assert self.owner is not None
        device = os.fstat(self._fd).st_dev
        if self.root_uid() == old_uid:
            os.fchown(self._fd, *self.owner)
        pending: list[list[str]] = [[]]
        while pending:
            parts = pending.pop()
            try:
                dfd = self.open_dir(parts)
            except (FileNotFoundError, PathDenied):
                continue
            try:
                for name in os.listdir(dfd):
                    if self._take_over_entry(dfd, name, old_uid, device):
                        pending.append([*parts, name])
            finally:
                os.close(dfd)

    def _take_over_entry(self, dfd: int, name: str, old_uid: int, device: int) -> bool:
        """Re-own one entry of ``dfd`` if ``old_uid`` owns it; return whether it is a directory to descend."""
        assert self.owner is not None
        try:
            fd = os.open(name, READ_FLAGS, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a symlink: its own owner changes, never its target's
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode) and st.st_uid == old_uid and st.st_dev == device:
                        os.chown(name, *self.owner, dir_fd=dfd, follow_symlinks=False)
            return False  # gone, or not openable (a socket): left as it is
        try:
            # judged on the opened entry itself, so a name swapped meanwhile cannot redirect the chown
            st = os.fstat(fd)
            if st.st_dev != device:
                return False
            if st.st_uid == old_uid:
                os.fchown(fd, *self.owner)
            return stat.S_ISDIR(st.st_mode)
        finally:
            os.close(fd)

    # -- files ---------------------------------------------------------------------

    def write_file(self, path: str, data: bytes | int, mode: int = 0o644, *, replace: bool = True) -> None:
        """Atomically create or replace ``path`` (parents created) with ``data``; without ``replace``, only create
        it (``FileExistsError`` when anything is at ``path``, which stays as it was).

        ``data`` is bytes, or an fd open for reading whose remaining content is copied.
        """
        temp = self.open_temp(path, mode)
        try:
            temp.write(data)
            temp.commit(replace=replace)
        finally:
            temp.discard()

    def open_temp(self, path: str, mode: int = 0o644) -> TempFile:
        """A new file beside ``path`` (parents created) that :meth:`TempFile.commit` renames over it: until then
        nothing at ``path`` changes. A directory at ``path`` is refused now, before anything is written."""
        parts = split_relpath(path)
        dfd = self.open_dir(parts[:-1], create=True, display=path)
        try:
            refuse_dir(dfd, parts[-1], path)
            tmp, fd = create_temp(dfd, parts[-1])
        except BaseException:
            os.close(dfd)
            raise
        return TempFile(dfd, fd, tmp, parts[-1], mode, self.owner)

    def refuse_unwritable(self, writes: Sequence[tuple[str, ProgramUser]]) -> None:
        """``PathDenied`` if a file at one of the paths is one its writer may not write, as opening it to write
        would be: :meth:`write_file` renames over it, which its write bit does not stop. Nothing there is fine.
        Each directory is opened once (a batch of many files in one directory costs a stat each)."""
        by_dir: dict[tuple[str, ...], list[tuple[str, str, ProgramUser]]] = {}
        for path, writer in writes:
            parts = split_relpath(path)
            by_dir.setdefault(tuple(parts[:-1]), []).append((parts[-1], path, writer))
        for dir_parts, entries in by_dir.items():
            try:
                dfd = self.open_dir(list(dir_parts), display=entries[0][1])
            except FileNotFoundError:
                continue
            try:
                for name, path, writer in entries:
                    try:
                        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISREG(st.st_mode):
                        writer.refuse(path, st, stat.S_IWUSR)
            finally:
                os.close(dfd)

    def open_file(self, path: str) -> tuple[int, os.stat_result]:
        """Open a regular file for reading without following any symlink."""
        parts = split_relpath(path)
        dfd = self.open_dir(parts[:-1], display=path)
        try:
            return open_regular(dfd, parts[-1], path)
        finally:
            os.close(dfd)

    def open_readable(self, path: str, reader: ProgramUser | None = None) -> tuple[int, os.stat_result]:
        """:meth:`open_file`; with ``reader``, ``PathDenied`` if that user may not read it (judged on the file
        opened, not on its name)."""
        fd, st = self.open_file(path)
        if reader is not None and not reader.may(st, stat.S_IRUSR):
            os.close(fd)
            reader.refuse(path, st, stat.S_IRUSR)
        return fd, st

    def read_file(
        self, path: str, max_bytes: int | None = None, reader: ProgramUser | None = None
    ) -> tuple[bytes, int]:
        """Return up to ``max_bytes`` of the file and its full size (``reader``: as in :meth:`open_readable`)."""
        fd, st = self.open_readable(path, reader)
        with os.fdopen(fd, "rb", closefd=True) as f:
            data = f.read() if max_bytes is None else f.read(max_bytes)
        return data, st.st_size

    def exists(self, path: str) -> bool:
        parts = split_relpath(path)
        try:
            dfd = self.open_dir(parts[:-1], display=path)
        except (FileNotFoundError, PathDenied):
            return False
        try:
            os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False
        finally:
            os.close(dfd)

    def lstat(self, path: str) -> os.stat_result:
        """The entry at ``path`` itself (a symlink is not followed); ``FileNotFoundError`` if absent."""
        parts = split_relpath(path)
        dfd = self.open_dir(parts[:-1], display=path)
        try:
            return os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
        finally:
            os.close(dfd)

    def read_link(self, path: str) -> str:
        """The target of the symlink at ``path``, as stored (never resolved)."""
        parts = split_relpath(path)
        dfd = self.open_dir(parts[:-1], display=path)
        try:
            return os.readlink(parts[-1], dir_fd=dfd)
        finally:
            os.close(dfd)

    def metadata_of(self, paths: Sequence[str]) -> list[dict[str, str]]:
        """The file metadata (:mod:`.xattrs`) of the entry at each path, in order: none where there is none or
        nothing is there. Each directory is opened once."""
        found: list[dict[str, str]] = [{} for _ in paths]
        by_dir: dict[tuple[str, ...], list[tuple[int, str]]] = {}
        for i, path in enumerate(paths):
            parts = split_relpath(path)
            by_dir.setdefault(tuple(parts[:-1]), []).append((i, parts[-1]))
        for dir_parts, entries in by_dir.items():
            try:
                dfd = self.open_dir(list(dir_parts), display="/".join(dir_parts))
            except (FileNotFoundError, NotADirectoryError, PathDenied):
                continue  # gone, or swapped for a link since it was listed
            try:
                for i, name in entries:
                    with contextlib.suppress(FileNotFoundError):
                        found[i] = xattrs.read_at(dfd, name)
            finally:
                os.close(dfd)
        return found

    def set_metadata(self, path: str, metadata: Mapping[str, str], writer: ProgramUser | None = None) -> bool:
        """Make ``metadata`` the whole metadata of the file or directory at ``path`` (never through a link);
        False where it keeps none. With ``writer``, ``PathDenied`` if that user may not write it."""
        if not xattrs.SUPPORTED:
            return False
        parts = split_relpath(path)
        dfd = self.open_dir(parts[:-1], display=path)
        try:
            fd = os.open(parts[-1], os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        finally:
            os.close(dfd)
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                raise PathDenied(path, "it has more than one hard link (another may be a host file's): no metadata")
            if writer is not None:
                writer.refuse(path, st, stat.S_IWUSR)
            return xattrs.write_at(fd, metadata)
        finally:
            os.close(fd)

    def make_dir(self, path: str) -> None:
        """Create the directory ``path`` and missing parents; an existing directory is fine."""
        os.close(self.open_dir(split_relpath(path), create=True, display=path))

    def rename(self, src: str, dst: str) -> None:
        """Move the entry ``src`` (a link moves as a link) to ``dst``, replacing a file there; parents of
        ``dst`` are created."""
        try:
            rename_path(lambda parts, create, display: self.open_dir(parts, create=create, display=display), src, dst)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            # a directory a copy-on-write fork shares with its snapshot (an overlay keeps no redirects): moved
            # as programs' own ``mv`` moves it there, by a copy (links never followed) and then a removal
            self._move_by_copy(src, dst)

    def _move_by_copy(self, src: str, dst: str) -> None:
        src_parts, dst_parts = split_relpath(src), split_relpath(dst)
        self.make_new_dir(dst_parts)
        sfd = self.open_dir(src_parts, display=src)
        try:
            dfd = self.open_dir(dst_parts, display=dst)
            try:
                copy_tree(sfd, dfd, keep_owner=os.geteuid() == 0)
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)
        self.remove(src)

    def symlink(self, target: str, path: str) -> None:
        """Create (or replace) a symlink at ``path``; the target is not validated here."""
        parts = split_relpath(path)
        dfd = self.open_dir(parts[:-1], create=True, display=path)
        try:
            with contextlib.suppress(FileNotFoundError):
                self._remove_entry(dfd, parts[-1])
            os.symlink(target, parts[-1], dir_fd=dfd)
        finally:
            os.close(dfd)

    def remove(self, path: str) -> None:
        """Remove a file, link or tree at ``path`` (never following links)."""
        parts = split_relpath(path)
        dfd = self.open_dir(parts[:-1], display=path)
        try:
            os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)  # FileNotFoundError when there is nothing
            self._remove_entry(dfd, parts[-1])
        finally:
            os.close(dfd)

    def _remove_entry(self, dfd: int, name: str) -> None:
        remove_tree(dfd, name, name, device=os.fstat(self._fd).st_dev)

    # -- walking -------------------------------------------------------------------

    def walk(self, start: list[str], max_entries: int = 200_000) -> Iterator[Entry]:
        """Yield regular files below ``start`` in sorted order; symlinks are never followed.

        Raises ``PathDenied`` for a tree deeper than :data:`MAX_WALK_DEPTH` below ``start``.
        """
        try:
            fd = self.open_dir(start)
        except (FileNotFoundError, NotADirectoryError, PathDenied):
            return
        except PermissionError:
            yield Entry("/".join(start), 0, 1, unreadable=True)
            return
        budget = max_entries
        for visit in walk_tree(fd, "/".join(start), max_depth=MAX_WALK_DEPTH):
            if visit.kind == "done":
                continue
            budget -= 1
            if budget < 0:
                return
            if visit.kind == "denied":
                yield Entry(visit.rel, 0, 1, unreadable=True)
            elif visit.kind == "file" and stat.S_ISREG(visit.st.st_mode):
                yield Entry(visit.rel, visit.st.st_size, visit.st.st_nlink)

    def scan(
        self, start: list[str], max_entries: int = 200_000, descend: int | None = None
    ) -> Iterator[tuple[str, os.stat_result, bool]]:
        """Yield ``(relpath, lstat, unreadable)`` for every entry below ``start`` (directories before what they
        hold, sorted), down to ``descend`` levels below it if given; symlinks are never followed. ``unreadable``: a
        directory whose entries we may not see.

        Raises ``PathDenied`` for a tree deeper than :data:`MAX_WALK_DEPTH` below ``start``.
        """
        try:
            fd = self.open_dir(start)
        except (FileNotFoundError, NotADirectoryError, PathDenied):
            return
        except PermissionError:
            if start:
                yield "/".join(start), self.lstat("/".join(start)), True
            return
        yield from itertools.islice(scan_tree(fd, "/".join(start), descend), max_entries)

    def disk_usage(self) -> int:
        """Bytes of disk the workspace takes: allocated blocks of every file, directory and link, at any depth.

        Blocks, not sizes: ``fallocate`` reserves blocks without growing a file and a sparse file's size is
        not on disk. A file with several hard links is counted once.
        """
        st = os.fstat(self._fd)
        total = _allocated(st)
        seen: set[tuple[int, int]] = set()
        # r-x for the owner on directories a program made unreadable: what it hid there counts too
        for visit in walk_tree(os.dup(self._fd), "", owner_bits=0o500):
            if visit.kind == "done":
                continue
            if visit.st.st_nlink > 1 and not stat.S_ISDIR(visit.st.st_mode):
                key = (visit.st.st_dev, visit.st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
            total += _allocated(visit.st)
        return total


class TempFile:
    """A file being written beside its target, created ``O_EXCL|O_NOFOLLOW`` in the target's directory (held open,
    so a directory a program swaps meanwhile cannot redirect the rename): :meth:`commit` renames it over the target
    whole; :meth:`discard` (also on garbage collection) removes it. Nothing half-written is ever at the target.

    Its methods may run on worker threads while another discards it: they take turns, so no write can reach a
    descriptor number closed and reused meanwhile.
    """

    def __init__(self, dfd: int, fd: int, tmp: str, name: str, mode: int, owner: tuple[int, int] | None = None) -> None:
        self._dfd, self._fd, self._tmp, self._name = dfd, fd, tmp, name
        self._mode, self._owner = mode, owner
        self._lock = threading.Lock()

    def write(self, data: bytes | bytearray | memoryview | int) -> None:
        """Append ``data`` (or copy the rest of the fd ``data``)."""
        with self._lock:
            if self._fd < 0:
                raise ValueError("the file was already committed or discarded")
            if isinstance(data, int):
                copy_fd(data, self._fd)
                return
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]

    def commit(self, *, replace: bool = True) -> None:
        """Give the file its mode and owner and rename it over the target (a file there is replaced, a hard
        link planted there too, never written through); without ``replace`` it is linked in where nothing is
        (``FileExistsError`` otherwise). The file is discarded if that fails."""
        with self._lock:
            if self._fd < 0:
                raise ValueError("the file was already committed or discarded")
            try:
                seal_temp(self._fd, self._mode, self._owner)
                if replace:
                    os.rename(self._tmp, self._name, src_dir_fd=self._dfd, dst_dir_fd=self._dfd)
                else:
                    # link(2) fails on any entry at the name, a dangling symlink too: nothing is ever written over
                    os.link(self._tmp, self._name, src_dir_fd=self._dfd, dst_dir_fd=self._dfd, follow_symlinks=False)
                    os.unlink(self._tmp, dir_fd=self._dfd)
            except BaseException:
                self._discard()
                raise
            self._close()

    def discard(self) -> None:
        """Remove the file unless it was committed; idempotent."""
        with self._lock:
            self._discard()

    def _discard(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp, dir_fd=self._dfd)
            self._close()

    def _close(self) -> None:
        os.close(self._fd)
        os.close(self._dfd)
        self._fd = self._dfd = -1

    def __del__(self) -> None:
        self.discard()


def _allocated(st: os.stat_result) -> int:
    blocks = getattr(st, "st_blocks", None)
    return st.st_size if blocks is None else blocks * 512
