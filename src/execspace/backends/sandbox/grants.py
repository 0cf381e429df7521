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

Every grant, whoever runs execspace, is opened here by a walk from ``/`` that follows no link (the policy's paths
are canonical: a link found now was planted since, maybe by a program with a write grant over a parent, and
following it would show its target, writable, where the grant was): the helper clones what that fd is and attaches
the clone on a tmpfs of its own mount namespace over the engine's stage directory, where bwrap binds it from; any
other grant bwrap binds by the fd (``--bind-fd``: it checks that what it mounted is what the fd is). Machine mode
binds every grant by its fd (its sandbox's uids are its user namespace's).
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

__all__ = ["GrantBind", "GrantHelper", "RunGrants"]

_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class GrantHelper:
    """An engine's part of the grants' staging (as root): the stage directory the helper mounts its tmpfs over, in
    the engine's workspace root (searchable by every sandbox uid, written by root only), and the helper; both made
    the first time a run stages a grant."""

    def __init__(self, root: Path, cache: Path) -> None:
        self.stage = root / ".grant-stage"
        self._cache = cache
        self._binary: Path | None = None
        self._building = threading.Lock()

    def binary(self) -> Path:
        """The built helper (built now, once, if missing), its stage made.

        Raises:
            SetupFailed: no C compiler here, the build failed, or something else is where the stage goes.
        """
        with self._building:
            if self._binary is None:
                _make_stage(self.stage)
                self._binary = grants_binary(self._cache)
            return self._binary


@dataclass(frozen=True, slots=True)
class GrantBind:
    """Where bwrap binds a host grant from: a path (the helper's clone on the stage), or an fd (``by_fd``)."""

    source: str
    by_fd: bool = False


@dataclass
class RunGrants:
    """The host grants of one run: :meth:`bind` opens each as the mounts are planned, :meth:`around` starts bwrap
    through the helper when one was staged; what was opened is closed once the run started, or by :meth:`close`
    when it does not get there.

    ``helper``: the engine's grant helper (as root, but for a machine), which stages write grants and read grants
    under a directory ``uid`` (the workspace's sandbox uid) cannot pass; None: every grant bound by its fd."""

    helper: GrantHelper | None = None
    uid: int = 0
    _args: list[str] = field(default_factory=list)
    _staged: list[int] = field(default_factory=list)
    _bound: list[int] = field(default_factory=list)

    @property
    def staged(self) -> bool:
        """Whether bwrap must start through the helper (:meth:`around`)."""
        return bool(self._staged)

    def bind(self, target: Target) -> GrantBind:
        """Where bwrap binds the host grant ``target`` from.

        Raises:
            PathDenied: the granted path is gone, or is (or lies under) a link now.
        """
        fd = _open_granted(target.path)
        if self.helper is not None and target.access is Access.WRITE:
            st = os.fstat(fd)
            self._args += ["idmap", str(st.st_uid), str(st.st_gid), str(fd)]
        elif self.helper is not None and closed_ancestor(target.path) is not None:
            self._args += ["plain", str(fd)]
        else:
            self._bound.append(fd)
            return GrantBind(str(fd), by_fd=True)
        self._staged.append(fd)
        return GrantBind(f"{self.helper.stage}/{len(self._staged) - 1}")

    def bwrap_fds(self) -> list[int]:
        """The fds bwrap binds grants from (``--bind-fd``), handed over: its launch passes and closes them."""
        fds, self._bound = self._bound, []
        return fds

    def around(self, launch: Launch) -> Launch:
        """``launch`` (bwrap) started by the helper as root, which stages the clones and drops to the sandbox's
        uid; the staged grants' fds close once it started."""
        assert self.helper is not None, "only a run with a helper stages grants"
        binary = self.helper.binary()
        fds, self._staged = self._staged, []
        for fd in fds:
            launch.stack.after_spawn(_closer(fd))
        argv = [str(binary), str(self.helper.stage), str(self.uid), "drop", *self._args, "--", *launch.argv]
        return replace(launch, argv=argv, pass_fds=(*launch.pass_fds, *fds))

    def close(self) -> None:
        """Close what :meth:`bind` opened and nothing took over, for a run that does not start (idempotent)."""
        fds, self._staged, self._bound = [*self._staged, *self._bound], [], []
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


def _make_stage(stage: Path) -> None:
    """The stage directory, made (root's, 0711) if missing.

    Raises:
        SetupFailed: something else is there.
    """
    stage.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        stage.mkdir(mode=0o711)
    st = os.lstat(stage)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
        raise SetupFailed("sandbox", f"{stage} is not a directory of root's", f"remove {stage}; it is made again")
