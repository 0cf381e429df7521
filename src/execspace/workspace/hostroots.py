"""Host sources (``host://`` inputs, ``stage_directory``), opened only inside the allowed host roots.

Checking a path and then opening it by path is a race: in between, a program with a write grant in a host
root can swap a directory on the path for a symlink to anything the caller may read. So a source is opened
from an fd of its allowed root, one component at a time with ``O_NOFOLLOW``, the way :mod:`.confine` walks
workspaces; the kernel never follows a symlink for us. A symlink met on the way is resolved here: its target
must lie in an allowed root and is walked again from that root's fd. A link the user put in a host root
(``latest -> v2``) therefore works while it stays inside the roots, and nothing outside them is ever opened,
whatever is swapped when. Below a staged directory, symlinks are skipped, never followed.

Functions here are synchronous; callers run them in a worker thread.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, LimitExceeded, PathDenied

__all__ = ["HostRoots", "HostSource", "TreeEntry", "closed_ancestor", "walk_tree"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# the last component may be a file or a directory; O_NONBLOCK: a FIFO cannot hang us
_LAST_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
#: Symlinks resolved for one source, as the kernel's own limit for one lookup.
_MAX_LINKS = 40
#: Deepest directory a staged tree may have (each level holds an fd while it is copied).
MAX_TREE_DEPTH = 256


@dataclass(slots=True)
class HostSource:
    """An opened host source: a regular file or a directory, and the real path it was reached by."""

    fd: int
    st: os.stat_result
    path: Path

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.st.st_mode)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> HostSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HostRoots:
    """The allowed host roots, resolved once; sources are opened only by walking from one of them."""

    def __init__(self, roots: Sequence[Path | str]) -> None:
        self.roots = tuple(Path(os.path.realpath(r)) for r in roots)

    def check(self, path: Path | str) -> Path:
        """The real path of ``path`` if it lies inside an allowed root (a fast first answer; :meth:`open`
        decides what is actually read)."""
        try:
            real = Path(os.path.realpath(path))
        except OSError as exc:  # a link swapped while it was read
            raise PathDenied(str(path), f"the path changed while it was resolved ({exc.strerror}); retry") from exc
        if self._root_of(real) is None:
            allowed = ", ".join(str(r) for r in self.roots) or "none"
            raise PathDenied(
                str(path),
                f"host path is outside the allowed host roots ({allowed}); "
                "pass host_roots=[...] to open_engine (CLI: inputs given on the command line are allowed)",
            )
        return real

    def _root_of(self, real: Path) -> Path | None:
        return next((r for r in self.roots if real == r or real.is_relative_to(r)), None)

    def open(self, path: Path | str) -> HostSource:
        """Open the host file or directory ``path``, reached from its allowed root without the kernel
        following any symlink.

        Raises:
            PathDenied: outside the allowed roots, or a symlink on the way leads out of them.
            FileNotFoundError: nothing there.
            InputError: neither a regular file nor a directory, or a component is not a directory.
        """
        want, followed = str(path), False
        for _ in range(_MAX_LINKS):
            try:
                real = self.check(want)
            except PathDenied as exc:
                if not followed:
                    raise
                raise PathDenied(
                    str(path),
                    f"a symlink on the way leads to {want}: {exc.reason}. Stage the target by a path inside "
                    "the roots, or allow its directory",
                ) from None
            root = self._root_of(real)
            assert root is not None  # check() refused it otherwise
            found = self._walk(root, real.relative_to(root).parts, str(path))
            if isinstance(found, HostSource):
                return found
            want, followed = found, True
        raise PathDenied(str(path), f"more than {_MAX_LINKS} symlinks on the way")

    def _walk(self, root: Path, parts: tuple[str, ...], shown: str) -> HostSource | str:
        """Open ``root/parts``; a symlink met on the way returns the path it leads to instead."""
        fd = _open_root(root, shown)
        here = root
        try:
            for i, name in enumerate(parts):
                last = i == len(parts) - 1
                try:
                    nfd = os.open(name, _LAST_FLAGS if last else _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    try:
                        target = os.readlink(name, dir_fd=fd)
                    except OSError:
                        raise InputError(f"host path {shown!r}: {here / name} is not a directory") from None
                    return os.path.join(here, target, *parts[i + 1 :])  # an absolute target replaces ``here``
                os.close(fd)
                fd, here = nfd, here / name
            st = os.fstat(fd)
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                raise InputError(f"host path {shown!r} is neither a regular file nor a directory")
            return HostSource(fd, st, here)
        except BaseException:
            os.close(fd)
            raise


def _open_root(root: Path, shown: str) -> int:
    """Open an allowed root from ``/``, refusing a symlink anywhere (roots were resolved when listed)."""
    fd = os.open("/", _DIR_FLAGS)
    try:
        for name in root.parts[1:]:
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise PathDenied(
                    shown, f"the allowed host root {root} is no longer a real directory; reopen the engine"
                ) from None
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


@dataclass(frozen=True, slots=True)
class TreeEntry:
    """A directory (before its contents) or an opened regular file found by :func:`walk_tree`."""

    rel: tuple[str, ...]
    st: os.stat_result
    fd: int | None
    """Regular files: open for reading until the walk moves on. Directories: ``None``."""


def walk_tree(
    dir_fd: int,
    keep: Callable[[tuple[str, ...]], bool] | None = None,
    max_depth: int = MAX_TREE_DEPTH,
) -> Iterator[TreeEntry]:
    """The directories and regular files below the open directory ``dir_fd``, sorted by name.

    Symlinks and other file types are skipped; nothing is followed, and an entry swapped for something
    else after it was listed is skipped too. ``keep(rel)`` may decline an entry (a declined
    directory is not entered). ``dir_fd`` stays open. Iterative: a deep tree cannot exhaust the stack.

    Raises:
        LimitExceeded: the tree is deeper than ``max_depth``.
    """
    stack: list[tuple[int, tuple[str, ...], Iterator[str]]] = []
    try:
        stack.append(_listed(os.dup(dir_fd), ()))
        while stack:
            fd, rel, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(fd)
                stack.pop()
                continue
            path = (*rel, name)
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode) and (keep is None or keep(path)):
                if len(path) > max_depth:
                    raise LimitExceeded(f"the tree is deeper than {max_depth} directories; stage a shallower one")
                sub = _open_entry(name, fd, _DIR_FLAGS)
                if sub is not None:
                    stack.append(_listed(sub, path))
                    yield TreeEntry(path, os.fstat(sub), None)
            elif stat.S_ISREG(st.st_mode) and (keep is None or keep(path)):
                yield from _file_entry(name, fd, path)
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _listed(fd: int, rel: tuple[str, ...]) -> tuple[int, tuple[str, ...], Iterator[str]]:
    """A directory fd to walk, with its names; closed if it cannot be listed."""
    try:
        return fd, rel, iter(sorted(os.listdir(fd)))
    except BaseException:
        os.close(fd)
        raise


def _file_entry(name: str, dfd: int, path: tuple[str, ...]) -> Iterator[TreeEntry]:
    ffd = _open_entry(name, dfd, _LAST_FLAGS)
    if ffd is None:
        return
    try:
        st = os.fstat(ffd)
        if stat.S_ISREG(st.st_mode):
            yield TreeEntry(path, st, ffd)
    finally:
        os.close(ffd)


def _open_entry(name: str, dfd: int, flags: int) -> int | None:
    """Open an entry just listed; ``None`` if it was removed or swapped for a symlink or another type."""
    try:
        return os.open(name, flags, dir_fd=dfd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
            return None
        raise


def closed_ancestor(path: str | os.PathLike[str]) -> str | None:
    """The directory above ``path`` that a sandbox's uid cannot pass, or None. As root, each sandbox (bwrap, its
    binds) runs as its workspace's own uid, which only the "other" bits let through (``/root`` is 0700); as a
    normal user it runs as us, so None. A missing directory on the way counts as passable: we make it."""
    if os.geteuid() != 0:
        return None
    parts = [c for c in os.fspath(path).split("/") if c]
    for n in range(len(parts)):
        anc = "/" + "/".join(parts[:n])
        try:
            if os.stat(anc).st_mode & stat.S_IXOTH:
                continue
        except FileNotFoundError:
            return None  # what is missing is made by us, searchable
        return anc
    return None
