"""File access confined to a workspace root, safe against what the program planted.

Every access walks from an open directory fd of the root, one component at a
time, with ``O_NOFOLLOW``: a symlink anywhere on the path is refused, and a
symlink swapped in after a check cannot redirect us because there is no
check-then-open gap. Writes go to a fresh temp file that is renamed into place,
so a hard link planted at the target is replaced, never written through. Reads
open with ``O_NONBLOCK`` (a FIFO cannot hang us), accept only regular files and
refuse files with more than one hard link (one may point at a host file).

All functions here are synchronous; callers batch them into one worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import PathDenied

__all__ = [
    "ConfinedRoot",
    "Entry",
    "split_relpath",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1024 * 1024


def split_relpath(path: str) -> list[str]:
    """Split a workspace-relative path into components, refusing every escape form."""
    if not path or "\0" in path:
        raise PathDenied(path, "empty path or NUL byte")
    if path.startswith("/"):
        raise PathDenied(path, "absolute paths are not allowed; use a path relative to the workspace")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise PathDenied(path, "'..' components are not allowed")
    if not parts:
        raise PathDenied(path, "path names the workspace root itself")
    return parts


@dataclass(frozen=True, slots=True)
class Entry:
    """A regular file found by a walk."""

    relpath: str
    size: int
    nlink: int


class ConfinedRoot:
    """Operations on one workspace root through an open directory fd."""

    def __init__(self, root: str, owner: tuple[int, int] | None = None) -> None:
        # owner: uid/gid given to files and directories we create (the sandbox's uid when we run as root)
        self.owner = owner
        try:
            self._fd = os.open(root, _DIR_FLAGS)
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

    def _step(self, fd: int, name: str, create: bool, display: str) -> int:
        try:
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
                    if self.owner is not None:
                        os.chown(name, *self.owner, dir_fd=fd, follow_symlinks=False)
                # what is there now may be a symlink a program swapped in since: refused like the first
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            # ``fd`` stays open here: open_dir owns it and closes it exactly once
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise PathDenied(display, f"component {name!r} is a symlink or not a directory") from exc
            raise
        os.close(fd)
        return nfd

    # -- ownership -----------------------------------------------------------------
    #
    # Every host-side chown of workspace entries is here, on an fd the walk opened: a program that swaps a
    # directory for a symlink between our check and our chown gets a refusal, never a chown through the link.

    def ensure_dir(self, parts: list[str]) -> None:
        """Create the directory ``parts`` (``[]``: the root) if missing and give it to ``owner`` if set."""
        fd = self.open_dir(parts, create=True)
        try:
            if self.owner is not None:
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
            fd = os.open(name, _READ_FLAGS | os.O_NOCTTY, dir_fd=dfd)
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

    def write_file(self, path: str, data: bytes | int, mode: int = 0o644) -> None:
        """Atomically create or replace ``path`` (parents created) with ``data``.

        ``data`` is bytes, or an fd open for reading whose remaining content is copied.
        """
        parts = split_relpath(path)
        dfd = self.open_dir(parts[:-1], create=True, display=path)
        try:
            self._replace(dfd, parts[-1], data, mode, path)
        finally:
            os.close(dfd)

    def _replace(self, dfd: int, name: str, data: bytes | int, mode: int, display: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                raise PathDenied(display, "a directory exists at this path")
        tmp = f".{name[:40]}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb", closefd=True) as f:
                if isinstance(data, int):
                    _copy_fd(data, f.fileno())
                else:
                    f.write(data)
                # setuid/setgid bits are never carried into a workspace
                os.fchmod(f.fileno(), mode & 0o777)
                if self.owner is not None:
                    os.fchown(f.fileno(), *self.owner)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise

    def open_file(self, path: str) -> tuple[int, os.stat_result]:
        """Open a regular file for reading without following any symlink."""
        parts = split_relpath(path)
        dfd = self.open_dir(parts[:-1], display=path)
        try:
            try:
                fd = os.open(parts[-1], _READ_FLAGS, dir_fd=dfd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise PathDenied(path, "the file is a symlink") from exc
                raise
        finally:
            os.close(dfd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise PathDenied(path, "not a regular file")
        if st.st_nlink > 1:
            os.close(fd)
            raise PathDenied(path, "the file has several hard links and may alias a file outside the workspace")
        return fd, st

    def read_file(self, path: str, max_bytes: int | None = None) -> tuple[bytes, int]:
        """Return up to ``max_bytes`` of the file and its full size."""
        fd, st = self.open_file(path)
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
            self._remove_entry(dfd, parts[-1])
        finally:
            os.close(dfd)

    def _remove_entry(self, dfd: int, name: str) -> None:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=dfd)
            return
        sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
        try:
            for child in os.listdir(sub):
                self._remove_entry(sub, child)
        finally:
            os.close(sub)
        os.rmdir(name, dir_fd=dfd)

    # -- walking -------------------------------------------------------------------

    def walk(self, start: list[str], max_entries: int = 200_000) -> Iterator[Entry]:
        """Yield regular files below ``start`` in sorted order; symlinks are never followed."""
        try:
            fd = self.open_dir(start)
        except (FileNotFoundError, NotADirectoryError, PathDenied):
            return
        budget = [max_entries]
        yield from self._walk_fd(fd, "/".join(start), budget)

    def _walk_fd(self, fd: int, prefix: str, budget: list[int]) -> Iterator[Entry]:
        try:
            with os.scandir(fd) as it:
                entries = sorted(it, key=lambda e: e.name)
            for e in entries:
                budget[0] -= 1
                if budget[0] < 0:
                    return
                rel = f"{prefix}/{e.name}" if prefix else e.name
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # removed since the listing (a leftover process at work)
                if stat.S_ISDIR(st.st_mode):
                    try:
                        sub = os.open(e.name, _DIR_FLAGS, dir_fd=fd)
                    except OSError:
                        continue
                    yield from self._walk_fd(sub, rel, budget)
                elif stat.S_ISREG(st.st_mode):
                    yield Entry(rel, st.st_size, st.st_nlink)
        finally:
            os.close(fd)

    def disk_usage(self) -> int:
        """Bytes used by regular files in the workspace (allocated blocks)."""
        total = 0
        for entry in self.walk([], max_entries=10_000_000):
            total += entry.size
        return total


def _copy_fd(src_fd: int, dst_fd: int) -> None:
    while chunk := os.read(src_fd, _CHUNK):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst_fd, view) :]
