"""Protected paths: project files that host tools interpret as configuration or code, one list for every backend.

A program that can write ``.git/config`` gets its ``core.fsmonitor`` run by the user's next ``git status`` on the
host; ``.envrc`` runs on ``cd`` (direnv), ``.vscode/tasks.json`` on opening the folder, ``AGENTS.md`` steers the
next agent, ``.github/workflows`` run with the repository's secrets. So wherever a program may write a project
root (the workspace root, a sandbox write grant over a directory), these stay readable and are never writable.
In a workspace, one that is missing must not be creatable either, and a bind mount needs something to mount on:
the sandbox creates a *transient* placeholder for the run (:class:`Placeholders`: an empty read-only file,
mounted read-only over itself, removed after the run), so that the workspace is as it was once the run is over.
In a host write grant (the user's own directory) nothing is ever planted: one that exists is mounted read-only,
one that is missing can be created by the program, and the run warns when one exists after it
(:meth:`PlaceholderRun.watch`). The sandbox mounts enforce it, the container's mounts too, and both backends'
file APIs refuse writes there. The ``local`` backend isolates nothing and protects nothing.

Left out on purpose: build and test files the user runs deliberately (``package.json``, ``pyproject.toml``,
``conftest.py``, ``setup.py``…: project code, like every script a program may change; review the diff),
``.gitattributes`` (its filter and diff drivers run only when configured, and the config is protected), and a
bare ``hooks`` (no host tool reads a ``hooks/`` directory at a project root, and the name is too common).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import threading
import time
import warnings
from dataclasses import dataclass

from ..errors import PathDenied
from ..models import Workspace
from .confine import ConfinedRoot

__all__ = [
    "DEFAULT_PROTECTED",
    "INTERNAL_DIR",
    "MAKEFILES",
    "PlaceholderRun",
    "Placeholders",
    "ProtectedPaths",
    "make_placeholder",
    "makefile_stand_in",
    "protected_hit",
]

#: execspace's own per-workspace directory (mask files); always protected.
INTERNAL_DIR = ".execspace"

#: Project-root-relative paths protected by default (children included).
DEFAULT_PROTECTED = (
    # git: config (core.fsmonitor, pager, aliases), hooks, submodules, and the hook managers
    ".git",
    ".gitmodules",
    ".githooks",
    ".husky",
    ".pre-commit-config.yaml",
    INTERNAL_DIR,
    # agents: instructions, settings, MCP servers
    ".agents",
    ".claude",
    ".codex",
    ".cursor",
    ".gemini",
    ".mcp.json",
    "AGENTS.md",
    "CLAUDE.md",
    "CLAUDE.local.md",
    "GEMINI.md",
    ".cursorrules",
    ".windsurfrules",
    ".clinerules",
    # editors and dev containers that run tasks or build images when the folder is opened
    ".vscode",
    ".idea",
    ".devcontainer",
    # CI (workflows run with the repository's secrets; Copilot instructions) and direnv (runs on cd)
    ".github",
    ".envrc",
    # make reads the first of these it finds
    "GNUmakefile",
    "makefile",
    "Makefile",
)


#: The names GNU make looks for, in its order: it reads the first that exists.
MAKEFILES = ("GNUmakefile", "makefile", "Makefile")


def makefile_stand_in(directory: str, name: str) -> str | None:
    """The makefile that make reads in ``directory`` when ``name`` (a missing one of :data:`MAKEFILES`, about to
    get a placeholder) is not there: a later name in make's order that is a regular file. Mounting it at the
    placeholder keeps ``make`` working in the sandbox: an empty placeholder ``GNUmakefile`` would hide the
    project's ``Makefile`` from it ("No targets"), while a missing one must stay uncreatable (a program's own
    ``GNUmakefile`` would run instead of the project's ``Makefile`` on the user's next ``make``)."""
    if name not in MAKEFILES:
        return None
    for later in MAKEFILES[MAKEFILES.index(name) + 1 :]:
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(os.path.join(directory, later)).st_mode):
                return os.path.join(directory, later)
    return None


def _is_under(path: str, base: str) -> bool:
    return path == base or path.startswith(base + "/")


def protected_hit(rel: str, protected: tuple[str, ...]) -> str | None:
    """The protected path ``rel`` (project-root-relative, normalised) is or lies under, if any."""
    for p in protected:
        if _is_under(rel, p):
            return p
    return None


def make_placeholder(root: str, rel: str) -> None:
    """Create a missing protected path under ``root`` as an empty read-only directory, for good, walking by
    directory fds (a symlink on the way refuses: ``PathDenied``), so that it can be mounted read-only: a program
    with a writable parent would otherwise create it and make it its own. Only for directories execspace owns
    (``.execspace``, a container's layout); a user's directory gets a :class:`Placeholders` one instead."""
    with ConfinedRoot(root) as cr:
        fd = cr.open_dir(rel.split("/"), create=True)
        try:
            os.fchmod(fd, 0o555)
        finally:
            os.close(fd)


class ProtectedPaths:
    """The file-API check of a backend whose programs cannot write protected paths: ``(ws, path, mode)`` raises
    ``PathDenied`` for a write at or under one (workspace-relative paths; host paths are only read)."""

    def __init__(self, protected: tuple[str, ...] = DEFAULT_PROTECTED) -> None:
        self.protected = tuple(dict.fromkeys((*protected, INTERNAL_DIR)))

    def __call__(self, ws: Workspace, path: str, mode: str) -> None:
        if mode != "write" or path.startswith("/"):
            return
        rel = "/".join(c for c in path.split("/") if c not in ("", "."))
        if hit := protected_hit(rel, self.protected):
            raise PathDenied(
                path,
                f"{hit!r} is protected: host tools run it as configuration or code, so it is never written "
                "into a workspace (open the engine with protected=... to change the list)",
            )


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FLAGS = os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: Looks at one name before giving up while other processes keep creating and removing it (5 ms apart).
_ATTEMPTS = 40

#: A placeholder's identity: host path, device, inode.
_Key = tuple[str, int, int]


@dataclass(slots=True)
class _Held:
    """A placeholder this engine created, and how many of its runs mount it now."""

    dir_fd: int
    """Its directory, opened without following links: it is removed there, never by path."""
    name: str
    fd: int
    """Open on it with a shared ``flock``: another process's cleanup sees it in use."""
    users: int = 1


class Placeholders:
    """Transient mount points for missing protected paths, shared by the runs of one engine.

    A missing protected path under a writable directory must not be creatable during a run, and a read-only
    mount needs something to mount on. So the run gets an empty regular file there (mode 0444; a file also
    blocks a directory of that name, and everything below it), created by directory fds with ``O_EXCL`` and
    ``O_NOFOLLOW`` and mounted read-only over itself: the program can neither write, remove nor rename a mount
    point (``EBUSY``). Once the last run mounting it is over, it is removed, by its directory fd, if it is still
    the empty regular file of the same inode; otherwise it is left and a ``RuntimeWarning`` says so.

    Removing it early would undo the protection: unlinking a mount point on the host detaches it in every other
    mount namespace, so a concurrent run could then create the path. Runs of this engine are counted per
    placeholder; runs of other processes (another engine on the same project) hold a shared ``flock`` on each
    empty protected file they mount, and a placeholder is only removed under an exclusive one (failing that it
    is left, with a warning). An engine that dies before its runs end leaves its empty placeholders behind.
    """

    def __init__(self) -> None:
        self._held: dict[_Key, _Held] = {}
        self._lock = threading.Lock()

    def run(self) -> PlaceholderRun:
        """The placeholders of one run, empty so far."""
        return PlaceholderRun(self)

    def _join(self, key: _Key) -> bool:
        with self._lock:
            held = self._held.get(key)
            if held is not None:
                held.users += 1
            return held is not None

    def _add(self, key: _Key, held: _Held) -> None:
        with self._lock:
            self._held[key] = held

    def _leave(self, key: _Key) -> str | None:
        with self._lock:  # held while removing: a run of this engine looking at the name waits, then sees it gone
            held = self._held[key]
            held.users -= 1
            if held.users:
                return None
            del self._held[key]
            try:
                return _remove(held, key)
            except OSError as exc:
                return f"{key[0]}: cannot remove the placeholder execspace made for a run ({exc}); remove it by hand"
            finally:
                os.close(held.fd)
                os.close(held.dir_fd)


class PlaceholderRun:
    """The protected paths of one run: the placeholders it mounts, and the missing paths it watches (a host grant's,
    where nothing is planted); :meth:`release` them once the run is over, however it ended."""

    def __init__(self, owner: Placeholders) -> None:
        self._owner = owner
        self._keys: list[_Key] = []
        self._shared: list[int] = []
        """fds with a shared lock on empty protected files this engine did not make (another process's)."""
        self._watched: list[str] = []

    def mount_point(self, root: str, rel: str) -> str:
        """What to mount read-only below the directory ``root`` so that the protected path ``rel`` can be neither
        changed nor created: ``rel`` itself, or its first component that is not a directory, a missing one
        created as a transient placeholder. Walks from ``root`` by directory fds, never following a link.

        Raises:
            PathDenied: ``rel`` is a symlink or lies under one; it keeps being created and removed.
        """
        found = self._mount_point(root, rel, create=True)
        assert found is not None, "a missing component was made"
        return found

    def existing_mount_point(self, root: str, rel: str) -> str | None:
        """What to mount read-only below ``root`` so that the protected path ``rel`` cannot be changed, as
        :meth:`mount_point`, but nothing made: None where a component is missing.

        Raises:
            PathDenied: ``rel`` is a symlink or lies under one.
        """
        return self._mount_point(root, rel, create=False)

    def _mount_point(self, root: str, rel: str, *, create: bool) -> str | None:
        parts = rel.split("/")
        dfd = os.open(root, _DIR_FLAGS)
        try:
            for n, name in enumerate(parts, 1):
                done = "/".join(parts[:n])
                path = os.path.join(root, done)
                mode = self._settle(dfd, name, path) if create else _existing(dfd, name, path)
                if mode is None:
                    return None
                if n == len(parts) or not stat.S_ISDIR(mode):
                    return done
                try:
                    nfd = os.open(name, _DIR_FLAGS, dir_fd=dfd)
                except OSError as exc:  # swapped for a link since we looked
                    raise PathDenied(os.path.join(root, done), f"changed while being checked ({exc.strerror})") from exc
                os.close(dfd)
                dfd = nfd
            raise AssertionError("unreachable: the last component returns")
        finally:
            os.close(dfd)

    def watch(self, path: str) -> None:
        """Watch the missing protected path ``path`` (a host grant's, which the run can create): :meth:`release`
        says if it exists then."""
        self._watched.append(path)

    def release(self) -> None:
        """Give back every placeholder of this run (idempotent); a placeholder found changed, or still used by
        another process, is left in place with a ``RuntimeWarning``; so is a watched path that exists now."""
        keys, self._keys = self._keys, []
        shared, self._shared = self._shared, []
        watched, self._watched = self._watched, []
        for fd in shared:
            os.close(fd)
        notes = [note for key in keys if (note := self._owner._leave(key))]
        notes += [_created(path) for path in watched if os.path.lexists(path)]
        for note in notes:  # after every removal: a warning turned into an error must not stop the rest
            warnings.warn(note, RuntimeWarning, stacklevel=2)

    def _settle(self, dfd: int, name: str, path: str) -> int:
        """The mode of ``name`` in ``dfd`` once it exists and is held for this run (created if missing)."""
        for _ in range(_ATTEMPTS):
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                if self._create(dfd, name, path):
                    return stat.S_IFREG
                continue  # another run made it meanwhile: hold that one
            if stat.S_ISLNK(st.st_mode):
                raise PathDenied(path, "a protected path is a symlink or lies under one; refusing to mount it")
            if not stat.S_ISREG(st.st_mode) or st.st_size or self._hold(dfd, name, path, st):
                return st.st_mode
            time.sleep(0.005)  # its owner is removing it right now: look again
        raise PathDenied(path, "a protected path keeps being created and removed by another process; retry the run")

    def _create(self, dfd: int, name: str, path: str) -> bool:
        try:
            fd = os.open(name, _NEW_FLAGS, 0o444, dir_fd=dfd)
        except FileExistsError:
            return False
        try:
            os.fchmod(fd, 0o444)  # whatever the umask
            fcntl.flock(fd, fcntl.LOCK_SH)  # a new inode: nobody else can hold a lock on it yet
            st = os.fstat(fd)
            held = _Held(os.dup(dfd), name, fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dfd)
            raise
        key = (path, st.st_dev, st.st_ino)
        self._owner._add(key, held)
        self._keys.append(key)
        return True

    def _hold(self, dfd: int, name: str, path: str, st: os.stat_result) -> bool:
        """Hold the empty file ``st`` (maybe a placeholder) for this run; False if it is going away."""
        key = (path, st.st_dev, st.st_ino)
        if self._owner._join(key):
            self._keys.append(key)
            return True
        try:
            fd = os.open(name, _OPEN_FLAGS, dir_fd=dfd)
        except OSError:
            return False  # gone, or swapped for a link: the next look tells
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            # locked only if still the one that bwrap will mount: its owner may have removed it before our lock
            if _same(os.fstat(fd), key) and _same(os.stat(name, dir_fd=dfd, follow_symlinks=False), key):
                self._shared.append(fd)
                return True
        except OSError:
            pass  # BlockingIOError: its owner holds it exclusively to remove it; FileNotFoundError: removed
        os.close(fd)
        return False


def _existing(dfd: int, name: str, path: str) -> int | None:
    """The mode of ``name`` in ``dfd``, or None when it is missing.

    Raises:
        PathDenied: it is a symlink.
    """
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise PathDenied(path, "a protected path is a symlink or lies under one; refusing to mount it")
    return st.st_mode


def _created(path: str) -> str:
    return (
        f"{path}: a protected path (host tools read it as configuration or code) was missing when the run began "
        "and exists now: the program (or someone else meanwhile) made it; review it before you use the directory"
    )


def _same(st: os.stat_result, key: _Key) -> bool:
    return (st.st_dev, st.st_ino) == key[1:]


def _remove(held: _Held, key: _Key) -> str | None:
    """Remove a placeholder nobody mounts any more, if it is still ours; else what was left and why."""
    try:
        fcntl.flock(held.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return (
            f"{key[0]}: left in place: a sandboxed run of another execspace process still mounts this empty "
            "placeholder; remove it once that run is over"
        )
    try:
        st = os.stat(held.name, dir_fd=held.dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None  # already removed by someone else: nothing was left
    if not (_same(st, key) and stat.S_ISREG(st.st_mode) and st.st_size == 0):
        return f"{key[0]}: left in place: it changed after execspace made it as an empty placeholder for a run"
    os.unlink(held.name, dir_fd=held.dir_fd)
    return None
