"""Copy a workspace tree by directory fds: bytes, modes and times kept, no link ever followed.

What a snapshot freezes and a fork or restore starts from (:mod:`.snapshots`). Every entry is opened from
its parent's fd with ``O_NOFOLLOW``: a symlink is copied as a symlink (its target text, never its target),
a regular file is read only when the opened inode is the one listed (a name swapped meanwhile is skipped),
and every destination entry is created fresh (``O_EXCL``), so a link planted in the destination is never
written through. Holes stay holes (``SEEK_DATA``/``SEEK_HOLE``). Hard links become separate copies of the
same bytes, and only when the tree's owner owns them: a link to a file of another user (planted where the
sandbox could link it) is skipped, so a copy made as root never reads what the program could not. Sockets,
FIFOs and device nodes are not copied; set-user/group-id bits are dropped. Files and directories keep their
metadata (:mod:`.xattrs`).

A copy of an overlay layer (``layer=True``, :mod:`.layers`) also keeps what makes it one: its whiteouts (0/0
character devices) and opaque directories (``trusted.overlay.opaque``); so does the copy of a directory marked as
holding layers (:data:`LAYERS_XATTR`: a sandbox's machine-mode upper layers in its workspace), for everything in it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass, field

from ..errors import LimitExceeded
from .confinecore import DIR_FLAGS, READ_FLAGS
from .xattrs import copy_between

__all__ = ["LAYERS_XATTR", "OVERLAY_XATTRS", "CopyStats", "copy_tree", "movable", "tree_size"]

#: Overlay attributes a copied layer keeps (the others describe one mount's upper only).
OVERLAY_XATTRS = ("trusted.overlay.opaque",)
#: Marks a directory whose subtree is overlay layers, copied as such (only root sets or reads ``trusted.*``: a
#: program cannot mark its own files so).
LAYERS_XATTR = "trusted.execspace.layers"

#: Permission bits a copy keeps (set-id bits are dropped: a copy is never a way to mint one).
_MODE_BITS = 0o1777
_MAX_ENTRIES = 1_000_000
_MAX_DEPTH = 256


@dataclass(slots=True)
class CopyStats:
    owner: int
    """The uid of the tree's root: a file with several links is copied only when it is theirs."""
    layer: bool = False
    entries: int = 0
    allocated: int = 0
    """Bytes the copy's blocks take on disk."""


def copy_tree(src: int, dst: int, *, keep_owner: bool, layer: bool = False) -> CopyStats:
    """Copy the contents of directory fd ``src`` into the empty directory fd ``dst``, then give ``dst`` the
    mode and times of ``src``. ``keep_owner`` (root only) keeps every entry's uid and gid; ``layer`` keeps
    overlay whiteouts and opaque directories.

    Raises:
        LimitExceeded: more than 1,000,000 entries, or deeper than 256 levels.
    """
    stats = CopyStats(os.fstat(src).st_uid, layer)
    _copy_dir(src, dst, keep_owner, stats, 0, layer)
    _finish_dir(src, dst, keep_owner, layer)
    return stats


def _copy_dir(src: int, dst: int, keep_owner: bool, stats: CopyStats, depth: int, layer: bool) -> None:
    if depth > _MAX_DEPTH:
        raise LimitExceeded(
            f"the workspace is more than {_MAX_DEPTH} directories deep, deeper than a snapshot or fork copies: "
            "remove or flatten the deep part (e.g. move it into an archive), then try again"
        )
    for name in os.listdir(src):
        stats.entries += 1
        if stats.entries > _MAX_ENTRIES:
            raise LimitExceeded(
                f"the workspace has more than {_MAX_ENTRIES:,} entries, more than a snapshot or fork copies: "
                "remove what is not needed (e.g. caches, or pack them into an archive), then try again"
            )
        try:
            st = os.stat(name, dir_fd=src, follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed while we copy
        if stat.S_ISDIR(st.st_mode):
            _copy_subdir(src, dst, name, keep_owner, stats, depth, layer)
        elif stat.S_ISREG(st.st_mode):
            _copy_file(src, dst, name, st, keep_owner, stats)
        elif stat.S_ISLNK(st.st_mode):
            _copy_symlink(src, dst, name, st, keep_owner)
        elif layer and stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
            os.mknod(name, stat.S_IFCHR, 0, dir_fd=dst)  # an overlay whiteout: the name is deleted here


def _copy_subdir(src: int, dst: int, name: str, keep_owner: bool, stats: CopyStats, depth: int, layer: bool) -> None:
    try:
        sfd = os.open(name, DIR_FLAGS, dir_fd=src)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
            return  # gone or swapped for a link meanwhile
        raise
    try:
        os.mkdir(name, 0o700, dir_fd=dst)
        dfd = os.open(name, DIR_FLAGS, dir_fd=dst)
        try:
            if not layer and _holds_layers(sfd):
                os.setxattr(dfd, LAYERS_XATTR, b"1")
                layer = True
            _copy_dir(sfd, dfd, keep_owner, stats, depth + 1, layer)
            _finish_dir(sfd, dfd, keep_owner, layer)
            stats.allocated += os.fstat(dfd).st_blocks * 512
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def _holds_layers(fd: int) -> bool:
    try:
        os.getxattr(fd, LAYERS_XATTR)
    except OSError:
        return False  # ENODATA: unmarked; EPERM: not root, who cannot have marked it either
    return True


def _finish_dir(sfd: int, dfd: int, keep_owner: bool, layer: bool) -> None:
    """Mode, owner and times last: a read-only directory is filled before it becomes read-only."""
    st = os.fstat(sfd)
    copy_between(sfd, dfd)
    if layer:
        for name in OVERLAY_XATTRS:
            with contextlib.suppress(OSError):  # ENODATA: not opaque
                os.setxattr(dfd, name, os.getxattr(sfd, name))
    if keep_owner:
        os.fchown(dfd, st.st_uid, st.st_gid)
    os.fchmod(dfd, st.st_mode & _MODE_BITS)
    os.utime(dfd, ns=(st.st_atime_ns, st.st_mtime_ns))


def _copy_file(src: int, dst: int, name: str, listed: os.stat_result, keep_owner: bool, stats: CopyStats) -> None:
    try:
        sfd = os.open(name, READ_FLAGS, dir_fd=src)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP):
            return
        raise
    try:
        st = os.fstat(sfd)
        if (st.st_dev, st.st_ino) != (listed.st_dev, listed.st_ino) or not stat.S_ISREG(st.st_mode):
            return  # swapped between the listing and the open
        if st.st_nlink > 1 and st.st_uid != stats.owner:
            return  # a hard link to someone else's file
        dfd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dst)
        try:
            _copy_data(sfd, dfd, st.st_size)
            copy_between(sfd, dfd)
            if keep_owner:
                os.fchown(dfd, st.st_uid, st.st_gid)
            os.fchmod(dfd, st.st_mode & _MODE_BITS)
            os.utime(dfd, ns=(st.st_atime_ns, st.st_mtime_ns))
            stats.allocated += os.fstat(dfd).st_blocks * 512
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def _copy_data(sfd: int, dfd: int, size: int) -> None:
    """Copy the data extents only (in the kernel), then set the size: holes stay holes."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(sfd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                break  # only a hole is left
            raise
        end = os.lseek(sfd, start, os.SEEK_HOLE)
        _copy_range(sfd, dfd, start, end)
        pos = end
    os.ftruncate(dfd, size)


def _copy_range(sfd: int, dfd: int, offset: int, end: int) -> None:
    while offset < end:
        try:
            n = os.copy_file_range(sfd, dfd, end - offset, offset, offset)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            # across filesystems (an overlay's merged view to its root fs, when flattening): sendfile
            os.lseek(dfd, offset, os.SEEK_SET)
            n = os.sendfile(dfd, sfd, offset, end - offset)
        if n == 0:
            return  # the file shrank meanwhile
        offset += n


def _copy_symlink(src: int, dst: int, name: str, st: os.stat_result, keep_owner: bool) -> None:
    try:
        target = os.readlink(name, dir_fd=src)
    except OSError:
        return  # gone, or no longer a link
    os.symlink(target, name, dir_fd=dst)
    if keep_owner:
        os.chown(name, st.st_uid, st.st_gid, dir_fd=dst, follow_symlinks=False)
    with contextlib.suppress(NotImplementedError):
        os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dst, follow_symlinks=False)


def movable(top: int) -> set[tuple[int, int]] | None:
    """Whether the tree at directory fd ``top`` may be moved whole instead of copied (made a layer of its own,
    :meth:`.branches.Branches.layer`): the ``(st_dev, st_ino)`` of its directories and files where it may, to look
    for processes holding them (:mod:`.holders`), None where it may not. The move must keep only what
    :func:`copy_tree` keeps: not where the copy would leave something out or change it — a hard link to a file
    outside the tree (the walk counts each file's links; a file with more than it saw has one elsewhere) or to
    another user's file, a set-user/group-id bit, a device node, a directory marked as holding layers, another
    filesystem mounted inside — nor past the copy's limits (the copy then says which). Hard links inside the tree
    stay links, as in any overlay layer."""
    st = os.fstat(top)
    walk = _Walk(st.st_uid, st.st_dev, {(st.st_dev, st.st_ino)})
    if not walk.directory(top, 0) or any(seen != nlink for nlink, seen in walk.linked.values()):
        return None
    return walk.inodes


@dataclass(slots=True)
class _Walk:
    owner: int
    dev: int
    inodes: set[tuple[int, int]]
    entries: int = 0
    linked: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    """Each file with several links: its link count and how many of its links the walk saw."""

    def directory(self, fd: int, depth: int) -> bool:
        if depth > _MAX_DEPTH or os.fstat(fd).st_dev != self.dev or _holds_layers(fd):
            return False
        for name in os.listdir(fd):
            self.entries += 1
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if self.entries > _MAX_ENTRIES or not self.entry(fd, name, st, depth):
                return False
        return True

    def entry(self, fd: int, name: str, st: os.stat_result, depth: int) -> bool:
        self.inodes.add((st.st_dev, st.st_ino))
        if stat.S_ISDIR(st.st_mode):
            sub = os.open(name, DIR_FLAGS, dir_fd=fd)
            try:
                return self.directory(sub, depth + 1)
            finally:
                os.close(sub)
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or st.st_mode & (stat.S_ISUID | stat.S_ISGID):
            return False
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            if st.st_uid != self.owner:
                return False
            _, seen = self.linked.get((st.st_dev, st.st_ino), (st.st_nlink, 0))
            self.linked[(st.st_dev, st.st_ino)] = (st.st_nlink, seen + 1)
        return True


def tree_size(top: int) -> int:
    """Bytes allocated by the directory fd ``top`` and everything in it (links never followed)."""
    total = 0
    # fwalk opens each directory from its parent without following a link, one fd per level
    for _, _dirs, files, fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
        total += os.fstat(fd).st_blocks * 512
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(name, dir_fd=fd, follow_symlinks=False).st_blocks * 512
    return total
