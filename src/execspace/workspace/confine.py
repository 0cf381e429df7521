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
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from ..errors import PathDenied

__all__ = [
    "MAX_WALK_DEPTH",
    "ConfinedRoot",
    "Entry",
    "remove_tree",
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
    """A regular file found by a walk, or (``unreadable``) a directory the walk could not read: a program took
    its permissions away, and what it holds is unknown."""

    relpath: str
    size: int
    nlink: int
    unreadable: bool = False


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

    def lstat(self, path: str) -> os.stat_result:
        """The entry at ``path`` itself (a symlink is not followed); ``FileNotFoundError`` if absent."""
        parts = split_relpath(path)
        dfd = self.open_dir(parts[:-1], display=path)
        try:
            return os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
        finally:
            os.close(dfd)

    def make_dir(self, path: str) -> None:
        """Create the directory ``path`` and missing parents; an existing directory is fine."""
        os.close(self.open_dir(split_relpath(path), create=True, display=path))

    def rename(self, src: str, dst: str) -> None:
        """Move the entry ``src`` (a link moves as a link) to ``dst``, replacing a file there; parents of
        ``dst`` are created."""
        src_parts, dst_parts = split_relpath(src), split_relpath(dst)
        if dst_parts[: len(src_parts)] == src_parts:
            raise PathDenied(dst, f"cannot move {src!r} into itself")
        sfd = self.open_dir(src_parts[:-1], display=src)
        try:
            os.stat(src_parts[-1], dir_fd=sfd, follow_symlinks=False)  # FileNotFoundError when there is nothing
            dfd = self.open_dir(dst_parts[:-1], create=True, display=dst)
            try:
                os.rename(src_parts[-1], dst_parts[-1], src_dir_fd=sfd, dst_dir_fd=dfd)
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)

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
        for visit in _walk_tree(fd, "/".join(start), max_depth=MAX_WALK_DEPTH):
            if visit.kind == "done":
                continue
            budget -= 1
            if budget < 0:
                return
            if visit.kind == "denied":
                yield Entry(visit.rel, 0, 1, unreadable=True)
            elif visit.kind == "file" and stat.S_ISREG(visit.st.st_mode):
                yield Entry(visit.rel, visit.st.st_size, visit.st.st_nlink)

    def scan(self, start: list[str], max_entries: int = 200_000) -> Iterator[tuple[str, os.stat_result, bool]]:
        """Yield ``(relpath, lstat, unreadable)`` for every entry below ``start`` (directories before what they
        hold, sorted); symlinks are never followed. ``unreadable``: a directory whose entries we may not see.

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
        budget = max_entries
        for visit in _walk_tree(fd, "/".join(start), max_depth=MAX_WALK_DEPTH):
            if visit.kind == "done" or visit.rel == ".":
                continue
            budget -= 1
            if budget < 0:
                return
            yield visit.rel, visit.st, visit.kind == "denied"

    def disk_usage(self) -> int:
        """Bytes of disk the workspace takes: allocated blocks of every file, directory and link, at any depth.

        Blocks, not sizes: ``fallocate`` reserves blocks without growing a file and a sparse file's size is
        not on disk. A file with several hard links is counted once.
        """
        st = os.fstat(self._fd)
        total = _allocated(st)
        seen: set[tuple[int, int]] = set()
        # r-x for the owner on directories a program made unreadable: what it hid there counts too
        for visit in _walk_tree(os.dup(self._fd), "", owner_bits=0o500):
            if visit.kind == "done":
                continue
            if visit.st.st_nlink > 1 and not stat.S_ISDIR(visit.st.st_mode):
                key = (visit.st.st_dev, visit.st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
            total += _allocated(visit.st)
        return total


#: Directory levels below its start that a walk (collect, listing) goes into; deeper trees are refused.
MAX_WALK_DEPTH = 256
#: Directory fds one walk holds at once: levels further up are closed and later reopened through ``..``
#: (checked to be the same directory), so a tree of any depth is walked without recursion or running out of fds.
_MAX_OPEN_DIRS = 32
#: Times a removal starts over when entries appeared behind it (a program still writing) before giving up.
_REMOVE_PASSES = 20
#: What a concurrent change makes an unlink or rmdir fail with; the next pass sees the new state.
_RACED = frozenset({errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR})


@dataclass(slots=True)
class _Visit:
    """One step of a walk: a non-directory entry (``file``), a directory entered (``dir``, its fd is
    ``dir_fd``'s child), left after all it held (``done``), or one we may not read (``denied``: only walks without
    ``owner_bits`` meet it); ``dir_fd`` is the directory holding ``name``."""

    kind: Literal["file", "dir", "done", "denied"]
    dir_fd: int
    name: str
    rel: str
    st: os.stat_result


@dataclass(slots=True)
class _Level:
    fd: int  # -1 while outside the window of open directory fds
    st: os.stat_result
    name: str
    rel: str
    todo: list[str]  # names still to visit, the next one last


def _walk_tree(top: int, prefix: str, *, max_depth: int | None = None, owner_bits: int = 0) -> Iterator[_Visit]:
    """Walk below the directory fd ``top`` (closed here) depth first, in sorted order, iteratively.

    Symlinks are never followed and no directory on another filesystem is entered (a mount point is left
    alone). ``owner_bits`` are given to the owner (us) of each directory before it is read: what removal
    needs in a read-only staged tree, what a measure needs in a directory a program made unreadable.
    """
    # every fd opened here is on the stack at once, so that the finally closes it whatever is raised
    top_st = os.fstat(top)
    stack = [_Level(top, top_st, "", prefix, [])]
    low = 0  # stack[:low] have their fds closed
    try:
        stack[0].todo = _listing(top)
        while stack:
            level = stack[-1]
            if not level.todo:
                if len(stack) == 1:
                    break
                parent = stack[-2]
                if parent.fd < 0:
                    parent.fd = _reopen_parent(level.fd, parent)
                    low -= 1
                stack.pop()
                os.close(level.fd)
                level.fd = -1
                yield _Visit("done", parent.fd, level.name, level.rel, level.st)
                continue
            name = level.todo.pop()
            rel = f"{level.rel}/{name}" if level.rel else name
            try:
                st = os.stat(name, dir_fd=level.fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed since the listing (a leftover process at work)
            except PermissionError:  # a directory we may list but not search: its entries are unknown
                yield _Visit("denied", level.fd, name, level.rel or ".", level.st)
                level.todo.clear()
                continue
            if not stat.S_ISDIR(st.st_mode):
                yield _Visit("file", level.fd, name, rel, st)
                continue
            if st.st_dev != top_st.st_dev:
                continue
            if max_depth is not None and len(stack) > max_depth:
                raise PathDenied(rel, f"more than {max_depth} directory levels below the start; flatten the tree")
            try:
                sub = _open_subdir(level.fd, name, owner_bits, top_st.st_dev)
            except PermissionError:
                yield _Visit("denied", level.fd, name, rel, st)
                continue
            if sub is None:
                continue
            sub_st = os.fstat(sub)
            stack.append(_Level(sub, sub_st, name, rel, []))
            stack[-1].todo = _listing(sub)
            if len(stack) - low > _MAX_OPEN_DIRS:
                os.close(stack[low].fd)
                stack[low].fd = -1
                low += 1
            yield _Visit("dir", level.fd, name, rel, sub_st)
    finally:
        for level in stack:
            if level.fd >= 0:
                os.close(level.fd)


def _listing(fd: int) -> list[str]:
    return sorted(os.listdir(fd), reverse=True)


def _reopen_parent(child_fd: int, parent: _Level) -> int:
    """Reopen a directory whose fd left the window, through its child's ``..``, if it is still the same one."""
    fd = os.open("..", _DIR_FLAGS, dir_fd=child_fd)
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (parent.st.st_dev, parent.st.st_ino):
        os.close(fd)
        raise PathDenied(parent.rel or ".", "the tree was moved while being walked; retry once no program runs there")
    return fd


def _open_subdir(dfd: int, name: str, owner_bits: int, device: int) -> int | None:
    """Open the directory ``name`` below ``dfd`` without following a link, with ``owner_bits`` given to its
    owner (us) first; None if it is now no directory on ``device``. ``PermissionError`` when we may not open it
    and have no ``owner_bits`` to give."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dfd)
    except PermissionError:
        if not owner_bits:
            raise  # the caller reports it: a program took our access away
        _grant_unopenable(dfd, name, owner_bits)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dfd)
        except OSError:
            return None
    except OSError:
        return None
    st = os.fstat(fd)
    if st.st_dev != device:
        os.close(fd)
        return None
    if st.st_mode & owner_bits != owner_bits and st.st_uid == os.geteuid():
        os.fchmod(fd, stat.S_IMODE(st.st_mode) | owner_bits)
    return fd


def _grant_unopenable(dfd: int, name: str, owner_bits: int) -> None:
    """Add ``owner_bits`` to the directory ``name`` below ``dfd`` that we cannot open, never through a link."""
    if not hasattr(os, "O_PATH"):  # macOS, where fchmodat takes AT_SYMLINK_NOFOLLOW
        mode = os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode
        os.chmod(name, stat.S_IMODE(mode) | owner_bits, dir_fd=dfd, follow_symlinks=False)
        return
    # Linux: an O_PATH fd needs no permission and pins the inode; chmod through /proc/self/fd acts on it alone
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) | owner_bits)
    finally:
        os.close(fd)


def _allocated(st: os.stat_result) -> int:
    blocks = getattr(st, "st_blocks", None)
    return st.st_size if blocks is None else blocks * 512


def remove_tree(dfd: int, name: str, display: str, *, device: int | None = None) -> None:
    """Remove ``name`` below the directory fd ``dfd`` with everything in it, by directory fds only.

    No path is ever resolved again: a directory a program renames away and replaces with a symlink costs
    that symlink, never what it points at. Nothing on a filesystem other than ``device`` (default: that of
    ``name`` itself) is entered. Entries a program adds meanwhile are removed by another pass; raises
    ``PathDenied`` if the tree is still changing after :data:`_REMOVE_PASSES` passes.
    """
    for _ in range(_REMOVE_PASSES):
        if not _remove_pass(dfd, name, device):
            return
    raise PathDenied(display, "entries kept appearing while it was removed; stop what writes there and retry")


def _remove_pass(dfd: int, name: str, device: int | None) -> bool:
    """One removal attempt; return whether something is still there."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        _unless_raced(os.unlink, name, dfd)
        return True
    top = _open_subdir(dfd, name, 0o700, st.st_dev if device is None else device)
    if top is None:
        return True
    try:
        for visit in _walk_tree(top, "", owner_bits=0o700):
            if visit.kind == "file":
                _unless_raced(os.unlink, visit.name, visit.dir_fd)
            elif visit.kind == "done":
                _unless_raced(os.rmdir, visit.name, visit.dir_fd)
    except PathDenied:
        return True  # a directory was moved under the walk: start over from the top
    _unless_raced(os.rmdir, name, dfd)
    return True


def _unless_raced(op: Callable[..., None], name: str, dfd: int) -> None:
    try:
        op(name, dir_fd=dfd)
    except OSError as exc:
        if exc.errno not in _RACED:
            raise


def _copy_fd(src_fd: int, dst_fd: int) -> None:
    while chunk := os.read(src_fd, _CHUNK):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst_fd, view) :]
