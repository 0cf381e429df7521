"""Host grants of a root caller's sandbox: what the user granted for writing, the program can write; what the user
granted at all, the program can reach, whatever the directories above it.

As root each sandbox runs as its workspace's own unprivileged uid (:func:`.bwrap.sandbox_uid`), so a grant bound as
it is shows the user's tree with its host owners: a root-owned project is read-only to the program, and one under a
0700 directory (``/root/proj``, a ``mkdtemp`` directory) cannot even be reached. So the host's root starts bwrap
through the grant helper (``grants.c``), which shows each such grant from a mount of its own:

* a **write grant** is an idmapped clone of the tree's mount: the uid and gid that own the grant's top directory
  there are the sandbox's uid, so the program can write what the tree's owner can, and what it makes lands on the
  host as the owner's (a file the user can edit, never one of a stranger uid). Every other owner in the tree stays
  unmapped (``nobody``), as it is outside the grant. No ownership or mode of the user's files is changed; the clone
  is ``nosuid,nodev``, and the seccomp filter refuses set-user-ID and set-group-ID bits
  (:data:`.seccomp.SET_ID_BITS`), which would make a file the program wrote run as the owner for every host user.
* a **read grant** under a directory the sandbox's uid cannot pass is a plain clone of its mount: reachable, with
  the permissions it has.

Each grant is opened here by a walk from ``/`` that follows no link (the policy's paths are canonical: a link found
now was planted since, maybe by a program with a write grant over a parent), the helper clones what that fd is and
attaches the clone on a tmpfs of its own mount namespace over the engine's stage directory, where bwrap binds it
from. Machine mode keeps its own view of grants (its sandbox's uids are its user namespace's).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ...errors import PathDenied, SetupFailed
from ...process.supervisor import Launch
from ...workspace.hostroots import closed_ancestor
from .policy import Access, Target
from .supervisorbin import grants_binary

__all__ = ["GrantStage", "StagedGrants", "stage_dir"]

_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class GrantStage:
    """An engine's part of the grants' staging (as root): the stage directory the helper mounts its tmpfs over, in
    the engine's workspace root (searchable by every sandbox uid, written by root only), and the helper, built the
    first time a run stages a grant."""

    def __init__(self, stage: Path, cache: Path) -> None:
        self.stage = stage
        self._cache = cache
        self._helper: Path | None = None
        self._building = threading.Lock()

    def helper(self) -> Path:
        """The built helper (built now, once, if missing).

        Raises:
            SetupFailed: no C compiler here, or the build failed.
        """
        with self._building:
            if self._helper is None:
                self._helper = grants_binary(self._cache)
            return self._helper

    def run(self, uid: int) -> StagedGrants:
        """The grants of one run of the sandbox uid ``uid``, none staged yet."""
        return StagedGrants(self, uid)


@dataclass
class StagedGrants:
    """The grants one run shows from the helper's mounts: :meth:`source` stages one as the mounts are planned,
    :meth:`around` starts bwrap through the helper; what was opened is closed once the run started, or by
    :meth:`close` when it does not get there."""

    owner: GrantStage
    uid: int
    _args: list[str] = field(default_factory=list)
    _fds: list[int] = field(default_factory=list)

    @property
    def used(self) -> bool:
        return bool(self._fds)

    def source(self, target: Target) -> str | None:
        """Where bwrap binds the host grant ``target`` from: its clone's place on the stage, or None for a grant
        bound as it is (a read grant the sandbox's uid can reach).

        Raises:
            PathDenied: the granted path is gone, or is (or lies under) a link now.
        """
        if target.access is Access.WRITE:
            fd = _open_granted(target.path)
            st = os.fstat(fd)
            self._args += ["idmap", str(st.st_uid), str(st.st_gid), str(fd)]
        elif closed_ancestor(target.path) is not None:
            fd = _open_granted(target.path)
            self._args += ["plain", str(fd)]
        else:
            return None
        self._fds.append(fd)
        return f"{self.owner.stage}/{len(self._fds) - 1}"

    def around(self, launch: Launch) -> Launch:
        """``launch`` (bwrap) started by the helper as root, which stages the clones and drops to the sandbox's
        uid; the grants' fds close once it started."""
        helper = self.owner.helper()
        fds, self._fds = self._fds, []
        for fd in fds:
            launch.stack.after_spawn(_closer(fd))
        argv = [str(helper), str(self.owner.stage), str(self.uid), "drop", *self._args, "--", *launch.argv]
        return replace(launch, argv=argv, pass_fds=(*launch.pass_fds, *fds))

    def close(self) -> None:
        """Close what :meth:`source` opened, for a run that does not start (idempotent)."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)


def _closer(fd: int) -> Callable[[], None]:
    return lambda: os.close(fd)


def _open_granted(path: str) -> int:
    """An ``O_PATH`` fd of the granted ``path`` (canonical), opened component by component from ``/`` without
    following a link."""
    parts = [c for c in path.split("/") if c]
    fd = os.open("/", _PATH_FLAGS | os.O_DIRECTORY)
    try:
        for n, name in enumerate(parts, 1):
            last = n == len(parts)
            try:
                nfd = os.open(name, _PATH_FLAGS | (0 if last else os.O_DIRECTORY), dir_fd=fd)
            except FileNotFoundError:
                raise PathDenied(path, "granted host path does not exist (create it first)") from None
            except OSError as exc:  # ELOOP, ENOTDIR: a link (or a file) where the grant's directories were
                raise _moved(path, exc.strerror) from None
            os.close(fd)
            fd = nfd
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            raise _moved(path, "it is a symbolic link")
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    return fd


def _moved(path: str, why: str | None) -> PathDenied:
    return PathDenied(
        path,
        f"the granted path changed since the policy was made ({why}): a grant is shown only where it was granted; "
        "grant the link's target, or remove the link",
    )


def stage_dir(root: Path) -> Path:
    """The engine's stage directory in its workspace root, made (root's, 0711) if missing.

    Raises:
        SetupFailed: something else is there.
    """
    stage = root / ".grant-stage"
    stage.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        stage.mkdir(mode=0o711)
    st = os.lstat(stage)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
        raise SetupFailed("sandbox", f"{stage} is not a directory of root's", f"remove {stage}; it is made again")
    return stage
