"""The confinement core: the rules of confined file access, standard library only.

:mod:`execspace.workspace.confine` builds on it in-process, and the file agent runs its *text* where the files
are (:mod:`execspace.workspace.fileagent`, before the agent's own), so the rules exist once. Hence: no execspace
import but the error type (a stand-in of the same shape when shipped), no third-party module.

Every component is opened from a directory fd with ``O_NOFOLLOW`` (a planted symlink is refused, never
followed); reads take only regular files with one hard link, opened non-blocking (a FIFO cannot hang us);
writes go to a fresh temp file renamed into place (a planted hard link is replaced, never written through);
walks and removal are iterative, hold a bounded number of directory fds and never resolve a path again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from typing import Any, Literal

try:
    from ..errors import PathDenied, PathIsDirectory
except ImportError:  # shipped as text (no package): the same shapes, so callers catch them alike

    class PathDenied(PermissionError):  # type: ignore[no-redef]
        def __init__(self, path: str, reason: str) -> None:
            self.path = path
            self.reason = reason
            super().__init__(f"path {path!r} denied: {reason}")

    class PathIsDirectory(PathDenied, IsADirectoryError):  # type: ignore[no-redef]
        def __init__(self, path: str, reason: str = "it is a directory, not a file") -> None:
            super().__init__(path, reason)
            self.errno = errno.EISDIR
            self.filename = path


__all__ = [
    "DIR_FLAGS",
    "MAX_WALK_DEPTH",
    "READ_FLAGS",
    "PathDenied",
    "PathIsDirectory",
    "Visit",
    "copy_fd",
    "create_temp",
    "open_regular",
    "refuse_dir",
    "remove_tree",
    "rename_path",
    "scan_tree",
    "seal_temp",
    "split_relpath",
    "step_dir",
    "walk_tree",
    "write_temp",
]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Non-blocking, so that a FIFO cannot hang us; no controlling terminal from a tty opened by mistake.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CHUNK = 1024 * 1024


def split_relpath(path: Any) -> list[str]:
    """Split a workspace-relative path into components, refusing every escape form."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise PathDenied(str(path), "empty path or NUL byte")
    if path.startswith("/"):
        raise PathDenied(path, "absolute paths are not allowed; use a path relative to the workspace")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise PathDenied(path, "'..' components are not allowed")
    if not parts:
        raise PathDenied(path, "path names the workspace root itself")
    return parts


def step_dir(fd: int, name: str, create: bool, display: str, owner: tuple[int, int] | None = None) -> int:
    """Open the directory ``name`` below ``fd`` (created, and given to ``owner``, if missing and asked), then
    close ``fd``; on failure ``fd`` stays open (its caller owns it). ``FileNotFoundError`` if it is missing."""
    try:
        try:
            nfd = os.open(name, DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=fd)
                if owner is not None:
                    os.chown(name, *owner, dir_fd=fd, follow_symlinks=False)
            # what is there now may be a symlink a program swapped in since: refused like the first
            nfd = os.open(name, DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PathDenied(display, f"component {name!r} is a symlink or not a directory") from exc
        raise
    os.close(fd)
    return nfd


def open_regular(dfd: int, name: str, display: str) -> tuple[int, os.stat_result]:
    """Open ``name`` below ``dfd`` for reading: a regular file with one hard link, never through a symlink."""
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathDenied(display, "the file is a symlink") from exc
        if exc.errno in (errno.ENXIO, errno.ENODEV):  # a socket, or a device without a driver: say which
            mode = os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode
            if not stat.S_ISREG(mode):
                raise PathDenied(display, f"not a regular file: it is {_kind(mode)}, which is never read") from exc
        raise
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        os.close(fd)
        raise PathIsDirectory(display)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise PathDenied(display, f"not a regular file: it is {_kind(st.st_mode)}, which is never read")
    if st.st_nlink > 1:
        os.close(fd)
        raise PathDenied(display, "the file has several hard links and may alias a file outside the workspace")
    return fd, st


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return kind
    return f"of type {stat.filemode(mode)[0]!r}"


def refuse_dir(dfd: int, name: str, display: str) -> None:
    """Refuse to replace a directory at ``name`` with a file."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
            raise PathIsDirectory(display, "a directory exists at this path")


def rename_path(open_dir: Callable[[list[str], bool, str], int], src: str, dst: str) -> None:
    """Move the entry ``src`` (a link moves as a link) to ``dst``, replacing a file there; ``open_dir(parts,
    create, display)`` opens a directory below the root (creating the parents of ``dst``).
    ``FileNotFoundError`` when there is nothing at ``src``."""
    src_parts, dst_parts = split_relpath(src), split_relpath(dst)
    if dst_parts[: len(src_parts)] == src_parts:
        raise PathDenied(dst, f"cannot move {src!r} into itself")
    sfd = open_dir(src_parts[:-1], False, src)
    try:
        os.stat(src_parts[-1], dir_fd=sfd, follow_symlinks=False)
        dfd = open_dir(dst_parts[:-1], True, dst)
        try:
            os.rename(src_parts[-1], dst_parts[-1], src_dir_fd=sfd, dst_dir_fd=dfd)
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def create_temp(dfd: int, name: str) -> tuple[str, int]:
    """A new empty file beside ``name`` in ``dfd``, created ``O_EXCL`` (nothing planted is ever opened), mode 0600:
    its name and an fd open for writing."""
    tmp = f".{name[:40]}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    return tmp, fd


def seal_temp(fd: int, mode: int, owner: tuple[int, int] | None = None) -> None:
    """Give a written temp file its final ``mode`` (never setuid/setgid) and ``owner``, before it is renamed."""
    os.fchmod(fd, mode & 0o777)
    if owner is not None:
        os.fchown(fd, *owner)


def write_temp(dfd: int, name: str, data: bytes | int, mode: int, owner: tuple[int, int] | None = None) -> str:
    """A fresh temp file beside ``name`` holding ``data`` (bytes, or an fd whose remaining content is copied),
    with ``mode`` (never setuid/setgid) and ``owner``; its name, for the caller to rename into place."""
    tmp, fd = create_temp(dfd, name)
    try:
        with os.fdopen(fd, "wb", closefd=True) as f:
            if isinstance(data, int):
                copy_fd(data, f.fileno())
            else:
                f.write(data)
            seal_temp(f.fileno(), mode, owner)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise
    return tmp


#: Directory levels below its start that a walk (collect, listing) goes into; deeper trees are refused.
MAX_WALK_DEPTH = 256
#: Directory fds one walk holds at once: levels further up are closed and later reopened through ``..``
#: (checked to be the same directory), so a tree of any depth is walked without recursion or running out of fds.
_MAX_OPEN_DIRS = 32
#: Times a removal starts over when entries appeared behind it (a program still writing) before giving up.
_REMOVE_PASSES = 20
#: What a concurrent change makes an unlink or rmdir fail with; the next pass sees the new state.
_RACED = frozenset({errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR})


class Visit:
    """One step of a walk: a non-directory entry (``file``), a directory entered (``dir``, its fd is
    ``dir_fd``'s child), left after all it held (``done``), one we may not read (``denied``: only walks without
    ``owner_bits`` meet it), or one at the walk's ``descend`` depth, not entered (``leaf``); ``dir_fd`` is the
    directory holding ``name``."""

    # plain classes, not dataclasses: shipped as text, this module is in no sys.modules for dataclasses to read
    __slots__ = ("dir_fd", "kind", "name", "rel", "st")

    def __init__(
        self,
        kind: Literal["file", "dir", "done", "denied", "leaf"],
        dir_fd: int,
        name: str,
        rel: str,
        st: os.stat_result,
    ) -> None:
        self.kind, self.dir_fd, self.name, self.rel, self.st = kind, dir_fd, name, rel, st


class _Level:
    __slots__ = ("fd", "name", "rel", "st", "todo")

    def __init__(self, fd: int, st: os.stat_result, name: str, rel: str, todo: list[str]) -> None:
        self.fd = fd  # -1 while outside the window of open directory fds
        self.st = st
        self.name = name
        self.rel = rel
        self.todo = todo  # names still to visit, the next one last


def walk_tree(
    top: int, prefix: str, *, max_depth: int | None = None, descend: int | None = None, owner_bits: int = 0
) -> Iterator[Visit]:
    """Walk below the directory fd ``top`` (closed here) depth first, in sorted order, iteratively.

    ``max_depth``: a directory deeper than that below ``top`` raises ``PathDenied``; ``descend``: directories that
    many levels below ``top`` are yielded (``leaf``) and not entered.

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
                yield Visit("done", parent.fd, level.name, level.rel, level.st)
                continue
            name = level.todo.pop()
            rel = f"{level.rel}/{name}" if level.rel else name
            try:
                st = os.stat(name, dir_fd=level.fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed since the listing (a leftover process at work)
            except PermissionError:  # a directory we may list but not search: its entries are unknown
                yield Visit("denied", level.fd, name, level.rel or ".", level.st)
                level.todo.clear()
                continue
            if not stat.S_ISDIR(st.st_mode):
                yield Visit("file", level.fd, name, rel, st)
                continue
            if st.st_dev != top_st.st_dev:
                continue
            if descend is not None and len(stack) >= descend:
                yield Visit("leaf", level.fd, name, rel, st)
                continue
            if max_depth is not None and len(stack) > max_depth:
                raise PathDenied(rel, f"more than {max_depth} directory levels below the start; flatten the tree")
            try:
                sub = _open_subdir(level.fd, name, owner_bits, top_st.st_dev)
            except PermissionError:
                yield Visit("denied", level.fd, name, rel, st)
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
            yield Visit("dir", level.fd, name, rel, sub_st)
    finally:
        for level in stack:
            if level.fd >= 0:
                os.close(level.fd)


def scan_tree(top: int, prefix: str, descend: int | None = None) -> Iterator[tuple[str, os.stat_result, bool]]:
    """Yield ``(relpath, lstat, unreadable)`` for every entry below the directory fd ``top`` (closed here), down to
    ``descend`` levels if given, directories before what they hold, sorted; symlinks are never followed.
    ``unreadable``: a directory whose entries we may not see. Raises ``PathDenied`` for a tree deeper than
    :data:`MAX_WALK_DEPTH`."""
    for visit in walk_tree(top, prefix, max_depth=MAX_WALK_DEPTH, descend=descend):
        if visit.kind != "done" and visit.rel != ".":
            yield visit.rel, visit.st, visit.kind == "denied"


def _listing(fd: int) -> list[str]:
    return sorted(os.listdir(fd), reverse=True)


def _reopen_parent(child_fd: int, parent: _Level) -> int:
    """Reopen a directory whose fd left the window, through its child's ``..``, if it is still the same one."""
    fd = os.open("..", DIR_FLAGS, dir_fd=child_fd)
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
        fd = os.open(name, DIR_FLAGS, dir_fd=dfd)
    except PermissionError:
        if not owner_bits:
            raise  # the caller reports it: a program took our access away
        _grant_unopenable(dfd, name, owner_bits)
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=dfd)
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
        for visit in walk_tree(top, "", owner_bits=0o700):
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


def copy_fd(src_fd: int, dst_fd: int) -> None:
    """Copy the rest of ``src_fd`` to ``dst_fd``, a chunk at a time."""
    while chunk := os.read(src_fd, _CHUNK):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst_fd, view) :]
