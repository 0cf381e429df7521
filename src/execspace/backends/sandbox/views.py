"""Host trees a sandbox shows read-only at their own paths although its uid cannot reach them (``read_views``).

As root each workspace's sandbox runs as an unprivileged uid of its own, which cannot pass a 0700 directory such as
``/root``: bwrap, running as that uid, cannot even find a bind's source there ("Can't find source path"), and an fd
of it does not help (bwrap resolves ``--bind-fd`` by its path). A view is mounted by the host's root instead, in a
mount namespace of the run's own, made just before the uid drop:

* the namespace's mounts are made private, so nothing reaches the host's mount table;
* a small tmpfs is mounted over the engine's view stage (a root-owned directory under the workspace root, a path
  every sandbox uid can pass), and each view is bind-mounted read-only (``nosuid``, ``nodev``) at ``<stage>/<n>``;
* bwrap then binds ``<stage>/<n>`` at the view's own host path, read-only like every other bind of the host.

Nothing of the user's is changed (no mode, no owner): the sandbox's uid reads what "other" may read in the tree,
no more, and the tree's top must be readable and searchable by others (checked when the engine opens). The
namespace ends with the run's processes; the stage stays an empty directory on the host.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ...errors import PolicyViolation, SetupFailed
from ...process.supervisor import Launch
from ...workspace.hostroots import closed_ancestor
from .policy import SandboxPolicy, is_under

__all__ = ["HostViews", "check_views", "open_views"]

_CLONE_NEWNS = 0x00020000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
#: Host locations a view may not name: the sandbox makes its own there.
_OWN = ("/proc", "/dev", "/sys", "/workspace")


@dataclass(frozen=True, slots=True)
class HostViews:
    """The views of an engine's sandboxes (root only: as a normal user a view is a read grant, see
    :func:`open_views`)."""

    stage: str
    """The root-owned directory the run's own tmpfs goes over (every directory on the way passable by others)."""
    paths: tuple[str, ...]
    """The trees shown, canonical; none inside another."""
    noexec: tuple[bool, ...]
    """Whether each tree's filesystem is mounted ``noexec`` on the host (its view keeps that)."""

    def bwrap_args(self) -> list[str]:
        """Each view's staged mount, bound read-only at the tree's own path."""
        return [a for n, path in enumerate(self.paths) for a in ("--ro-bind", f"{self.stage}/{n}", path)]

    def around(self, launch: Launch) -> Launch:
        """``launch`` (bwrap, about to drop to the sandbox's uid) with the views mounted first, as root, in a mount
        namespace of its own."""
        mount = _mounter(self.stage.encode(), [(p.encode(), x) for p, x in zip(self.paths, self.noexec, strict=True)])
        inner, uid, gid = launch.preexec_fn, launch.user, launch.group

        def preexec() -> None:
            mount()
            if inner is not None:
                inner()
            # Popen drops a user= before it calls preexec_fn: the drop comes after the mounts instead
            if gid is not None:
                os.setgroups([])
                os.setgid(gid)
            if uid is not None:
                os.setuid(uid)

        return replace(launch, preexec_fn=preexec, user=None, group=None)


def open_views(paths: Sequence[str], policy: SandboxPolicy, hidden: Sequence[Path], stage: Path) -> HostViews | None:
    """The views of ``paths`` for an engine, or None where none needs mounting: as a normal user (the sandbox runs
    as us: a read grant shows them, see :func:`check_views`) or when none lies under a directory the sandbox's uid
    cannot pass. The stage is made (root's, 0711) when there is one.

    Raises:
        PolicyViolation: a view the sandbox may not show (see :func:`check_views`).
        SetupFailed: the stage is not root's directory.
    """
    check_views(paths, policy, hidden)
    staged = tuple(sorted(p for p in _outermost(paths) if closed_ancestor(p) is not None))
    if os.geteuid() != 0 or not staged:
        return None
    _make_stage(stage)
    return HostViews(str(stage), staged, tuple(bool(os.statvfs(p).f_flag & os.ST_NOEXEC) for p in staged))


def check_views(paths: Sequence[str], policy: SandboxPolicy, hidden: Sequence[Path]) -> None:
    """Refuse a view that is not a canonical absolute directory others may read and search, that names what the
    sandbox makes itself, or that would show what no sandbox may see (a hidden directory of execspace's, a path the
    policy denies or a credential store)."""
    denied = (*policy.no_access_paths, *policy.credential_paths, *(os.path.realpath(h) for h in hidden))
    for path in paths:
        if not path.startswith("/") or os.path.realpath(path) != path or path == "/":
            raise PolicyViolation(f"read_views: {path!r} must be a canonical absolute path (symlinks resolved), not /")
        if any(is_under(path, own) or is_under(own, path) for own in _OWN):
            raise PolicyViolation(f"read_views: {path} would replace the sandbox's own /proc, /dev, /sys or /workspace")
        if hit := next((d for d in denied if d.startswith("/") and (is_under(d, path) or is_under(path, d))), None):
            raise PolicyViolation(
                f"read_views: {path} would show {hit}, which no sandbox may see (a no-access path, a credential "
                "store, or execspace's own workspaces, keys and environments); name a narrower directory"
            )
        try:
            st = os.stat(path)
        except OSError as exc:
            raise PolicyViolation(f"read_views: {path} cannot be shown: {exc.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise PolicyViolation(f"read_views: {path} is not a directory")
        if os.geteuid() == 0 and st.st_mode & 0o005 != 0o005:
            raise PolicyViolation(
                f"read_views: {path} (mode {stat.S_IMODE(st.st_mode):04o}) is not readable and searchable by others, "
                "and as root each sandbox runs as an unprivileged uid of its own, which reads only what others may; "
                "execspace does not change your files' modes: make the tree with a umask of 022 (e.g. recreate the "
                "venv), or use a runtime environment (execspace env build code-interpreter)"
            )


def _outermost(paths: Sequence[str]) -> list[str]:
    """``paths`` without those inside another (its view shows them already)."""
    unique = sorted(set(paths))
    return [p for p in unique if not any(q != p and is_under(p, q) for q in unique)]


def _make_stage(stage: Path) -> None:
    stage.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        stage.mkdir(mode=0o711)
    st = os.lstat(stage)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise SetupFailed("sandbox", f"{stage} is not a directory of root's that only root writes", f"remove {stage}")
    if closed_ancestor(stage) is not None:
        raise SetupFailed(
            "sandbox",
            f"the view stage {stage} lies under {closed_ancestor(stage)}, which the sandbox's uid cannot pass",
            "choose a workspace_root where every directory on the way is searchable by others",
        )


def _mounter(stage: bytes, trees: list[tuple[bytes, bool]]) -> Callable[[], None]:
    """What the child runs as root before it drops its uid: everything it needs is resolved here, in the parent
    (libc, the paths as bytes), so that the child only makes system calls."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    points = [(src, stage + b"/" + str(n).encode(), noexec) for n, (src, noexec) in enumerate(trees)]

    def call(result: int, what: bytes) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{os.strerror(err)}: mounting the sandbox's view of {what.decode(errors='replace')}")

    def mount() -> None:
        call(libc.unshare(_CLONE_NEWNS), b"a mount namespace")
        call(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), b"/")
        call(libc.mount(b"tmpfs", stage, b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, b"mode=0711,size=16k"), stage)
        for src, at, noexec in points:
            os.mkdir(at, 0o711)
            call(libc.mount(src, at, None, _MS_BIND | _MS_REC, None), src)
            flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | (_MS_NOEXEC if noexec else 0)
            call(libc.mount(None, at, None, flags, None), src)

    return mount
