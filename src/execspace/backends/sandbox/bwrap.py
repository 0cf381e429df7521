"""bubblewrap command lines, and the probe that proves the boundary works here.

Design (see docs/backends/sandbox.md):

* The sandbox root is an empty tmpfs. Only system directories of the host are
  bound into it, read-only (:data:`SYSTEM_TOP`: ``/usr``, ``/etc``, ``/opt``…); ``/home``, ``/root``,
  ``/mnt``, ``/srv``, ``/run``, the host's ``/tmp`` and any other top-level directory are not there at all.
  Once every mount point is made in it, it is remounted read-only, and so is ``/dev``: the only writable
  tmpfs are ``/tmp`` and ``/dev/shm``, sized from the run's limits (:func:`tmpfs_sizes`), since a tmpfs page is
  memory that ``RLIMIT_AS`` does not count and that no disk bound sees. Where the workspace's ``tmp/`` is
  writable (and a sandbox is not a machine), ``/tmp`` is that directory instead (a program bind, made before the
  host grants, which may lie under it): what a program leaves there stays with the workspace, as ``$TMPDIR``.
* The workspace is bound at ``/workspace`` as its :class:`~.policy.SandboxPolicy`
  says (:func:`policy_mounts`): by default read-only, with the layout directories
  bound writable over it; extra host grants, no-access masks (an empty mode-000
  tmpfs or file) and protected paths bound read-only come on top, most specific
  last. Credential stores of the host HOME are masked wherever they are visible.
* All namespaces are unshared (user, pid, ipc, uts, cgroup, and net unless the
  network is on); nested user namespaces are disabled; a new session stops
  terminal injection; the sandbox dies with its supervisor.
* bwrap loads a seccomp filter (:mod:`.seccomp`) just before it runs the program, and in its own
  init (pid 1 of the sandbox), whose ``/proc/1`` is masked so that nothing in the sandbox can reach it.
* **Started by root, bwrap is not a boundary** (uid 0 in the sandbox is host
  root with all capabilities of its namespace). So when we are root, bwrap
  itself is started as an unprivileged host uid, derived per workspace (from the
  identity of its root directory, see :func:`sandbox_uid`); file
  permission checks then are those of that uid, and RLIMIT_NPROC counts the
  processes of that workspace only.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import posixpath
import secrets
import shutil
import stat
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import PathDenied, PolicyViolation, SetupFailed
from ...workspace.confine import ConfinedRoot
from ...workspace.hostroots import closed_ancestor
from ...workspace.protected import PlaceholderRun, make_placeholder, makefile_stand_in
from .grants import GrantBind
from .policy import INTERNAL_DIR, Access, Resolver, SandboxPolicy, Target, is_under, path_parts

__all__ = [
    "SANDBOX_WORKSPACE",
    "SHM_SIZE",
    "SUPERVISOR_PATH",
    "TMP",
    "TMP_SIZE",
    "BwrapConfig",
    "ProgramBind",
    "build_argv",
    "data_fd",
    "hidden_by_default",
    "is_machine_uid",
    "is_sandbox_uid",
    "machine_uid",
    "open_program_bind",
    "policy_mounts",
    "sandbox_uid",
    "tmpfs_sizes",
    "visible_path_entries",
]

#: Where the workspace appears inside the sandbox.
SANDBOX_WORKSPACE = "/workspace"
#: The sandbox's temporary directory, which is the workspace's ``tmp/`` where that is writable (a program bind).
TMP = "/tmp"
#: Where a sandbox session's supervisor is, read-only (a copy bwrap makes of it, see :mod:`.session`).
SUPERVISOR_PATH = "/.execspace-supervisor"

#: Top-level host entries never bound into the sandbox.
#: The host's top-level directories a sandbox sees (read-only), where they exist: the system's. Anything else at
#: the root (``/home``, ``/root``, ``/tmp``, ``/mnt``, ``/srv``, but also a ``/work`` or ``/data`` of the host's
#: own) holds people's files, and is there only through a grant.
SYSTEM_TOP = frozenset({"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "var", "nix", "snap"})

_UID_BASE = 1_500_000_000
_UID_SPAN = 100_000_000
#: Where a workspace directory keeps the random part of its sandbox uid (see :func:`sandbox_uid`).
_NONCE_XATTR = "trusted.execspace.uid-nonce"


def sandbox_uid(ws_root: Path | str) -> int:
    """A host uid unused by real accounts, distinct per workspace (collisions are negligible).

    Derived from the identity of the workspace's root directory, not from its path: as root, a random nonce
    kept on it in a ``trusted.*`` extended attribute, set the first time (as a normal user, its device and
    inode). Both
    follow the directory through a rename: a warm pool slot renamed into place keeps its uid, as the bwrap
    bind of a running sandbox keeps following it. A new directory gets a new nonce, also on the inode of a
    deleted workspace (filesystems hand freed inodes out again at once), so nothing that workspace left
    behind under its uid (a process, a file in a write grant) reaches the new one. A program cannot pick
    another workspace's uid: it cannot replace its workspace root (the parent is the host's), and only
    CAP_SYS_ADMIN reads or writes ``trusted.*`` attributes. A workspace copied elsewhere (a new inode) gets
    a new uid; a copy-on-write fork keeps its snapshot's nonce, hence its uid (see
    :mod:`execspace.workspace.layers`). A normal user never runs a sandbox as this uid, and cannot keep the
    nonce: there the uid comes from device and inode alone.

    Raises:
        OSError: ``ws_root`` does not exist (or is a symlink).
        SetupFailed: as root, the filesystem cannot keep the nonce.
    """
    fd = os.open(ws_root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        nonce = _uid_nonce(fd, ws_root) if os.geteuid() == 0 else b""
    finally:
        os.close(fd)
    # the nonce alone when there is one: a copy-on-write fork carries its snapshot's (its files are the
    # snapshot's, owned by that uid), though its root is another inode, of an overlay mount
    digest = hashlib.sha256(nonce or f"{st.st_dev}:{st.st_ino}:".encode()).digest()
    return _UID_BASE + int.from_bytes(digest[:8], "big") % _UID_SPAN


def _uid_nonce(fd: int, ws_root: Path | str) -> bytes:
    try:
        return os.getxattr(fd, _NONCE_XATTR)
    except OSError as exc:
        if exc.errno != errno.ENODATA:
            raise _no_nonce(ws_root, exc) from exc
    try:
        os.setxattr(fd, _NONCE_XATTR, secrets.token_bytes(16), os.XATTR_CREATE)
    except FileExistsError:
        pass  # another process gave it one first: theirs counts, as for every later caller
    except OSError as exc:
        raise _no_nonce(ws_root, exc) from exc
    return os.getxattr(fd, _NONCE_XATTR)


def _no_nonce(ws_root: Path | str, exc: OSError) -> SetupFailed:
    return SetupFailed(
        "sandbox",
        f"the filesystem of {ws_root} cannot keep the workspace's uid nonce ({_NONCE_XATTR}: {exc.strerror})",
        "put the workspace root on a filesystem with trusted extended attributes (ext4, xfs, btrfs, tmpfs), "
        "or run as a normal user",
    )


def is_sandbox_uid(uid: int) -> bool:
    """Whether ``uid`` is in the range :func:`sandbox_uid` hands out (never a real account's)."""
    return _UID_BASE <= uid < _UID_BASE + _UID_SPAN


def machine_uid(uid: int) -> int:
    """The host uid that is root in the machine-mode sandbox of the workspace whose :func:`sandbox_uid` is ``uid``
    (:mod:`.machine`): the next span up, so that it is unique per workspace as ``uid`` is and never any
    workspace's sandbox uid (nor a real account's)."""
    return uid + _UID_SPAN


def is_machine_uid(uid: int) -> bool:
    """Whether ``uid`` is in the range :func:`machine_uid` hands out."""
    return is_sandbox_uid(uid - _UID_SPAN)


#: Size of a sandbox's ``/tmp`` (a tmpfs), unless a bound makes it smaller (:func:`tmpfs_sizes`).
TMP_SIZE = 256 * 1024 * 1024
#: Size of a sandbox's ``/dev/shm`` (a tmpfs: POSIX shared memory and semaphores, Python's ``multiprocessing``
#: locks), unless a bound makes it smaller.
SHM_SIZE = 64 * 1024 * 1024
_PAGE = os.sysconf("SC_PAGE_SIZE")


def tmpfs_sizes(*bounds: int | None) -> tuple[int, int]:
    """The sizes of a sandbox's writable tmpfs, ``/tmp`` and ``/dev/shm``: together at most the smallest of the
    ``bounds`` that are set (its memory limit: ``RLIMIT_AS`` does not count tmpfs pages; a disk bound), a quarter
    of it for ``/dev/shm``; :data:`TMP_SIZE` and :data:`SHM_SIZE` at most. Never 0, which tmpfs reads as no limit."""
    given = [b for b in bounds if b is not None]
    if not given:
        return TMP_SIZE, SHM_SIZE
    budget = min(given)
    shm = max(_PAGE, min(SHM_SIZE, budget // 4))
    return max(_PAGE, min(TMP_SIZE, budget - shm)), shm


@dataclass(frozen=True, slots=True)
class BwrapConfig:
    bwrap: str
    network: bool
    tmp_size: int = TMP_SIZE
    shm_size: int = SHM_SIZE
    mounts: Sequence[str] | None = None
    """What :func:`policy_mounts` made for this run; None binds the workspace writable as is (the probe)."""
    files: Sequence[tuple[int, str]] = ()
    """``(fd, path)``: system files the sandbox shows with the content read from ``fd`` (passed to bwrap), read-only,
    in place of the host's (``system_files``)."""
    init_fd: int | None = None
    """A session's supervisor binary (an fd passed to bwrap): copied to :data:`SUPERVISOR_PATH` and run as
    PID 1 of the sandbox (``--as-pid-1``, no bwrap init), the program being ``[SUPERVISOR_PATH, ...]``."""
    system_root: str | None = None
    """A rootfs environment's root filesystem, whose system directories the sandbox shows in place of the host's."""
    machine: Sequence[str] | None = None
    """Machine mode (:mod:`.machine`): bwrap runs as root of the sandbox's user namespace, made by the machine
    helper (no user namespace of its own), and these are its system directories (the overlays' binds) instead of
    the read-only binds of :attr:`system_root`'s or the host's."""
    tmp_bound: bool = False
    """``/tmp`` is a directory of the workspace (its ``tmp/``, a program bind in :attr:`mounts`), not a tmpfs."""


def _top_level_binds(system_root: str | None) -> list[str]:
    """The system directories of the host (or of ``system_root``) at the sandbox's ``/``, read-only."""
    root = system_root or "/"
    args: list[str] = []
    for entry in sorted(os.listdir(root)):
        if entry not in SYSTEM_TOP:
            continue
        path = os.path.join(root, entry)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            args += ["--symlink", os.readlink(path), f"/{entry}"]
        elif stat.S_ISDIR(st.st_mode):
            args += ["--ro-bind", path, f"/{entry}"]
    return args


def _network_files(network: bool) -> list[str]:
    if not network:
        return []
    real = os.path.realpath("/etc/resolv.conf")
    # resolv.conf often points into /run, which is otherwise hidden
    if real.startswith("/run/") and os.path.exists(real):
        return ["--ro-bind", real, real]
    return []


#: Mounted over ``/proc/1``, bwrap's own init in the sandbox's PID namespace. It is not the program's: it has
#: only bwrap's filter (a Jupyter kernel stacks more on itself), it holds the sandbox's life (its
#: ``--die-with-parent``) and its argv is the host's bwrap command line. Through ``/proc/1/mem`` a program of
#: the same uid could rewrite it, since seccomp sees ``open`` and ``write`` but not which file they touch. An
#: empty read-only mode-000 tmpfs leaves nothing under ``/proc/1`` to open; the program cannot unmount it (no
#: capabilities, the mount API is filtered) and no other path names that directory.
_HIDE_INIT = ("--perms", "0000", "--tmpfs", "/proc/1", "--remount-ro", "/proc/1")
#: A user namespace of bwrap's own, in which no further one can be made (machine mode has the helper's; its seccomp
#: filter refuses new namespaces in either mode).
_OWN_USER_NS = ("--unshare-user", "--disable-userns")
_NAMESPACES = ("--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent",
               "--new-session")  # fmt: skip
_MACHINE_CAPS = ("--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_DAC_READ_SEARCH")


def build_argv(
    cfg: BwrapConfig,
    ws_root: Path,
    cwd_rel: str,
    argv: Sequence[str],
    *,
    seccomp_fd: int | None = None,
    chdir: str | None = None,
) -> list[str]:
    """The complete bwrap command line for one run. No environment values appear in it.

    ``chdir``: the program's working directory when it is not ``/workspace/<cwd_rel>`` (one named through a
    program bind, ``/home/user/sub``).

    ``seccomp_fd``: an fd (passed to bwrap) holding the BPF program bwrap loads before exec (see :mod:`.seccomp`).
    What the program may see of the host (credential stores included) comes from the policy, in ``cfg.mounts``
    (:func:`policy_mounts`), whoever starts it.
    """
    args = [cfg.bwrap, *(_OWN_USER_NS if cfg.machine is None else ()), *_NAMESPACES]
    # machine mode: setpriv starts the program as user, sudo makes it root again; nothing else is kept
    args += ["--cap-drop", "ALL", *(() if cfg.machine is None else _MACHINE_CAPS), "--hostname", "execspace"]
    if not cfg.network:
        args.append("--unshare-net")
    if cfg.init_fd is not None:
        args.append("--as-pid-1")
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    args += _top_level_binds(cfg.system_root) if cfg.machine is None else cfg.machine
    # a machine's bwrap is its root, whose tmpfs would be root's: /tmp and /dev/shm are everyone's, as on a system
    shared = () if cfg.machine is None else ("--perms", "1777")
    args += ["--dev", "/dev", *shared, "--size", str(cfg.shm_size), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    args += ["--proc", "/proc", *_HIDE_INIT]
    if not cfg.tmp_bound:
        args += [*shared, "--size", str(cfg.tmp_size), "--tmpfs", "/tmp"]
    args += _network_files(cfg.network)
    for fd, path in cfg.files:
        args += ["--perms", "0644", "--ro-bind-data", str(fd), path]
    if cfg.init_fd is not None:
        # a copy, not a bind: the binary is in a directory private to this user, which the sandbox's uid
        # cannot reach (and /proc/self/fd is masked: the supervisor is PID 1)
        args += ["--perms", "0755", "--ro-bind-data", str(cfg.init_fd), SUPERVISOR_PATH]
    ws = SANDBOX_WORKSPACE
    args += cfg.mounts if cfg.mounts is not None else ["--bind", str(ws_root), ws]
    # last: every mount point above is made in the root's tmpfs (unsized), which nothing may write after
    args += ["--remount-ro", "/"]
    args += [
        "--chdir", chdir or f"{ws}/{cwd_rel}".rstrip("/"),
        "--",
        *argv,
    ]  # fmt: skip
    return args


@functools.lru_cache(maxsize=64)  # every run asks, with one of a few PATHs
def visible_path_entries(path: str) -> str:
    """Keep the PATH entries that exist inside the sandbox (not under hidden top-level dirs)."""
    return ":".join(dict.fromkeys(entry for entry in path.split(":") if not hidden_by_default(entry)))


def hidden_by_default(path: str) -> bool:
    """Whether the host path ``path`` (absolute) is missing from every sandbox unless a policy grants it:
    it lies under a top-level directory the sandbox does not bind (``/home``, ``/root``, ``/tmp``…)."""
    parts = Path(path).parts
    return not (len(parts) > 1 and parts[0] == "/" and parts[1] in SYSTEM_TOP)


def find_bwrap(explicit: str | None = None) -> str | None:
    return explicit or shutil.which("bwrap")


# -- the policy as mounts ---------------------------------------------------------------------------

#: Most glob matches masked in one run; beyond that the policy is refused (each mask is a mount).
MAX_GLOB_MASKS = 1000
#: Most workspace entries walked to expand no-access globs at the start of a run.
MAX_GLOB_WALK = 200_000
#: The empty, mode-000 file bound over files nobody may read (directories get an empty tmpfs).
MASK_FILE = f"{INTERNAL_DIR}/denied"
#: Where bwrap binds a host grant from (:meth:`~.grants.RunGrants.bind`): a clone's path, or the grant's fd.
GrantSource = Callable[[Target], GrantBind]
#: Host locations no grant may cover: the sandbox has its own, a host one would undo them.
_UNGRANTABLE = ("/proc", "/dev", "/sys", SANDBOX_WORKSPACE)


@dataclass(frozen=True, slots=True, order=True)
class _Op:
    """One mount. Mounts are made shallow to deep, so none covers a deeper one made before it
    (bwrap binds are recursive from the host side); at equal depth a mask comes last."""

    depth: int
    mask: bool
    dest: str
    args: tuple[str, ...]


@dataclass(slots=True)
class _Plan:
    """The mounts of one run, planned before any is emitted."""

    root: str
    visible_top: frozenset[str]
    held: PlaceholderRun
    """The run's protected paths: transient placeholders for missing ones in the workspace, and the missing ones
    of host grants, watched."""
    system_root: str | None
    """A rootfs environment's root: what the sandbox shows at its system directories, in place of the host's."""
    stage: GrantSource | None = None
    """Where a host grant is bound from (:mod:`.grants`: the grant helper's clones, or the grant's fd); None: from
    its path (the probe's plans)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Host grants bound from a clone: their path → the clone's path, where bwrap finds what lies below them."""
    host_ops: list[_Op] = field(default_factory=list)
    ws_ops: list[_Op] = field(default_factory=list)
    host_levels: dict[str, Access] = field(default_factory=dict)
    ws_levels: dict[str, Access] = field(default_factory=dict)
    remount: list[str] = field(default_factory=list)
    mask_file: bool = False

    def host_level(self, path: str) -> Access | None:
        """What the deepest planned host mount gives ``path`` (None: not in the sandbox at all)."""
        best = max((p for p in self.host_levels if is_under(path, p)), key=len, default=None)
        if best is not None:
            return self.host_levels[best]
        top = path_parts(path)[:1]
        return Access.READ if top and top[0] in self.visible_top else None

    def ws_level(self, rel: str) -> Access:
        """What the deepest planned workspace mount gives ``rel`` ("." is /workspace)."""
        parts = path_parts(rel)
        for n in range(len(parts), 0, -1):
            anc = "/".join(parts[:n])
            if anc in self.ws_levels:
                return self.ws_levels[anc]
        return self.ws_levels["."]

    def kind(self, path: str) -> str:
        """What is at ``path`` as the sandbox shows it before any grant: the rootfs's under a system directory."""
        top = path_parts(path)[:1]
        if self.system_root is not None and top and top[0] in SYSTEM_TOP:
            return _host_kind(self.system_root + path)
        return _host_kind(path)

    def bind(self, ops: list[_Op], src: str, dest: str, depth: int, access: Access, *, by_fd: bool = False) -> None:
        flag = ("--bind" if access.can_write else "--ro-bind") + ("-fd" if by_fd else "")
        ops.append(_Op(depth, False, dest, (flag, src, dest)))

    def host_source(self, path: str) -> str:
        """Where bwrap finds the host path ``path``: under the source of the deepest grant bound from elsewhere that
        holds it, else ``path`` itself."""
        grant = max((g for g in self.sources if is_under(path, g)), key=len, default=None)
        return path if grant is None else self.sources[grant] + path[len(grant) :]

    def mask(self, ops: list[_Op], dest: str, depth: int, kind: str, *, traversable: bool = False) -> None:
        if kind == "dir":
            # an empty tmpfs, remounted read-only once every deeper grant is mounted in it;
            # 0111 lets deeper grants be reached without listing anything else
            mode = "0111" if traversable else "0000"
            ops.append(_Op(depth, True, dest, ("--perms", mode, "--tmpfs", dest)))
            self.remount.append(dest)
        else:
            ops.append(_Op(depth, True, dest, ("--ro-bind", os.path.join(self.root, MASK_FILE), dest)))
            self.mask_file = True


def _visible_top(system_root: str | None) -> frozenset[str]:
    root = system_root or "/"
    return frozenset(
        e
        for e in os.listdir(root)
        if e in SYSTEM_TOP and os.path.isdir(os.path.join(root, e)) and not os.path.islink(os.path.join(root, e))
    )


def _host_kind(path: str) -> str:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "missing"
    return "dir" if stat.S_ISDIR(st.st_mode) else "file"


def _ws_kind(root: str, rel: str) -> str:
    """dir, file, missing, or link (a symlink or non-directory on the way: never bound from)."""
    if rel == ".":
        return "dir"
    parts = rel.split("/")
    try:
        with ConfinedRoot(root) as cr:
            dfd = cr.open_dir(parts[:-1], display=rel)
            try:
                st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
            finally:
                os.close(dfd)
    except FileNotFoundError:
        return "missing"
    except (PathDenied, NotADirectoryError):
        return "link"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    return "link" if stat.S_ISLNK(st.st_mode) else "file"


def _opened_below(path: str, targets: Sequence[Target]) -> bool:
    return any(t.path != path and is_under(t.path, path) and t.access.can_read for t in targets)


# -- host paths


def _host_grant(p: _Plan, t: Target, hidden: Sequence[str], shown: Collection[str]) -> None:
    if t.path == "/" or any(is_under(t.path, u) or is_under(u, t.path) for u in _UNGRANTABLE):
        raise PolicyViolation(f"a grant on {t.path} would replace the sandbox's own /proc, /dev, /sys or /workspace")
    inside = next((h for h in hidden if t.path != h and is_under(t.path, h)), None)
    if inside is not None and t.path in shown and t.access.can_write:
        raise PolicyViolation(
            f"a write grant on {t.path}: a built runtime environment is shown read-only to every sandbox that runs "
            "in it (another workspace's runs execute its code); grant it read-only, or name it with environment="
        )
    if inside is not None and t.path not in shown:
        # a grant covering one is masked (see _hide); one inside it would show what the mask hides
        raise PolicyViolation(
            f"a grant on {t.path} lies inside {inside}, which no sandbox may see (the engine's workspaces, "
            "the execspace daemon's key and socket, the runtime environment store, whose environments are shown "
            "read-only one by one with environment=); grant a path outside it"
        )
    if _host_kind(t.path) == "missing":
        raise PathDenied(t.path, "granted host path does not exist (create it first)")
    if p.system_root is not None and p.host_level(t.path) is not None and p.kind(t.path) == "missing":
        # bwrap would have to make the mount point in the read-only rootfs
        raise PathDenied(
            t.path,
            "the rootfs environment has no such path to show it at; grant a path outside its "
            "system directories (/usr, /etc, /opt…), e.g. under /srv or /data",
        )
    depth = len(path_parts(t.path))
    found = p.stage(t) if p.stage is not None else None
    if found is None or found.by_fd:
        _check_reachable(t.path)
    else:
        p.sources[t.path] = found.source
    if found is None:
        p.bind(p.host_ops, p.host_source(t.path), t.path, depth, t.access)
    else:
        p.bind(p.host_ops, found.source, t.path, depth, t.access, by_fd=found.by_fd)
    p.host_levels[t.path] = t.access


def _check_reachable(path: str) -> None:
    """Say why a grant cannot be bound, where bwrap would fail with its bare message."""
    closed = closed_ancestor(path)
    if closed is not None:
        raise PolicyViolation(
            f"cannot grant {path}: as root the sandbox runs as the workspace's own uid, which cannot pass {closed} "
            "(not searchable by others), and this sandbox shows grants only as they are (machine mode); grant a "
            "path outside it (e.g. put the environment under /opt), or run execspace as a normal user (its sandbox "
            "then runs as that user)"
        )


def _pin_host(p: _Plan, path: str) -> None:
    """Bind each writable ancestor of ``path`` over itself: a mount point cannot be renamed, so the
    program cannot move a denied path out from under its rule (the next run would not mask it)."""
    parts = path_parts(path)
    for n in range(1, len(parts)):
        anc = "/" + "/".join(parts[:n])
        if anc not in p.host_levels and p.host_level(anc) is Access.WRITE:
            p.bind(p.host_ops, p.host_source(anc), anc, n, Access.WRITE)
            p.host_levels[anc] = Access.WRITE


def _host_protected(p: _Plan, t: Target) -> None:
    """A protected path under a host write grant: bound read-only where it exists. A missing one is left as it is,
    nothing planted in the user's directory (a mount needs something to mount on): the program can create it, and
    the run says so when it is over (:meth:`~execspace.workspace.protected.PlaceholderRun.watch`)."""
    grant = max((g for g in p.host_levels if is_under(t.path, g) and g != t.path), key=len, default=None)
    if grant is None or p.host_level(t.path) is not Access.WRITE:
        return  # not writable here (a deeper read or no-access rule decides): nothing to protect
    found = p.held.existing_mount_point(grant, posixpath.relpath(t.path, grant))
    if found is None:
        p.held.watch(t.path)
        return
    path = posixpath.join(grant, found)
    _pin_host(p, path)
    p.bind(p.host_ops, p.host_source(path), path, len(path_parts(path)), Access.READ)
    p.host_levels[path] = Access.READ


def _host_denial(p: _Plan, t: Target, targets: Sequence[Target]) -> None:
    level = p.host_level(t.path)  # paths are canonical since SandboxPolicy.with_home
    if level is None or level is Access.NONE:
        return  # not in the sandbox at all, or hidden already
    kind = _host_kind(t.path)
    if kind == "missing":
        # nothing to hide, unless the program could create it (an authorized_keys, say)
        if level is Access.WRITE:
            raise PolicyViolation(
                f"cannot keep {t.path} out of reach: it does not exist under a writable grant, so the "
                "program could create it; create it first, or narrow the write grant"
            )
        return
    if p.kind(t.path) == "missing":
        return  # a rootfs without it: nothing there to hide
    _pin_host(p, t.path)
    p.mask(p.host_ops, t.path, len(path_parts(t.path)), kind, traversable=_opened_below(t.path, targets))
    p.host_levels[t.path] = Access.NONE


def _hide(p: _Plan, real: str) -> None:
    """Mask a host directory the sandbox must not see through a grant or the system view (workspaces at their
    host paths, the environment store); what it shows of it (an environment tree) is bound after, below the mask."""
    level = p.host_level(real)
    if level is not None and level is not Access.NONE and _host_kind(real) == "dir" and p.kind(real) == "dir":
        _pin_host(p, real)
        shows = any(path != real and is_under(path, real) and lv.can_read for path, lv in p.host_levels.items())
        p.mask(p.host_ops, real, len(path_parts(real)), "dir", traversable=shows)
        p.host_levels[real] = Access.NONE


# -- workspace paths


def _ws_dest(rel: str) -> str:
    return SANDBOX_WORKSPACE if rel == "." else f"{SANDBOX_WORKSPACE}/{rel}"


def _pin_ws(p: _Plan, rel: str) -> None:
    """The workspace twin of :func:`_pin_host`: writable ancestors of ``rel`` become mount points."""
    parts = rel.split("/")
    for n in range(1, len(parts)):
        anc = "/".join(parts[:n])
        if anc not in p.ws_levels and p.ws_level(anc) is Access.WRITE:
            p.bind(p.ws_ops, os.path.join(p.root, anc), _ws_dest(anc), n, Access.WRITE)
            p.ws_levels[anc] = Access.WRITE


def _ws_rule(p: _Plan, t: Target, targets: Sequence[Target]) -> None:
    assert t.rel is not None
    parent_rel = t.rel.rpartition("/")[0] or "."
    parent = p.ws_level(parent_rel)
    if t.access is parent:
        return  # the parent's mount already gives it
    kind = _ws_kind(p.root, t.rel)
    depth = len(path_parts(t.rel))
    if t.access is Access.NONE:
        if kind in ("dir", "file"):  # missing: nothing to hide; a link: its target is judged where it lies
            _pin_ws(p, t.rel)
            p.mask(p.ws_ops, _ws_dest(t.rel), depth, kind, traversable=_opened_below(t.path, targets))
            p.ws_levels[t.rel] = Access.NONE
        return
    if t.protected and parent.can_write and kind != "link" and t.rel != INTERNAL_DIR:
        # through the run's placeholders even where something is there: it may be a concurrent run's placeholder,
        # which this run must hold too (its last holder removes it, and a host unlink would detach this run's mount)
        _ws_placeholder(p, t.rel)
        return
    if kind == "missing" and t.protected and parent.can_write:
        make_placeholder(p.root, t.rel)  # execspace's own directory (it holds the mask file), kept
        kind = "dir"
    if kind == "missing":
        return
    if kind == "link":
        raise PathDenied(t.rel, "is a symlink or lies under one; refusing to mount it (remove it and retry)")
    _pin_ws(p, t.rel)
    p.bind(p.ws_ops, t.path, _ws_dest(t.rel), depth, t.access)
    p.ws_levels[t.rel] = t.access


def _ws_placeholder(p: _Plan, rel: str) -> None:
    """A protected workspace path under a writable parent, bound read-only: a missing one as a transient
    placeholder (the workspace may be the user's own directory, ``--workspace DIR``: it is left as it was)."""
    mount = p.held.mount_point(p.root, rel)
    _pin_ws(p, mount)
    host = os.path.join(p.root, mount)
    source = _stand_in(host) if mount == rel else None
    p.bind(p.ws_ops, source or host, _ws_dest(mount), len(path_parts(mount)), Access.READ)
    p.ws_levels[mount] = Access.READ


def _stand_in(host: str) -> str | None:
    """What to show at an empty placeholder file: the makefile make reads when it is missing
    (:func:`makefile_stand_in`); never in place of a makefile with content."""
    st = os.lstat(host)
    if not stat.S_ISREG(st.st_mode) or st.st_size:
        return None
    return makefile_stand_in(os.path.dirname(host), os.path.basename(host))


def _glob_matches(p: _Plan, policy: SandboxPolicy) -> list[tuple[str, str]]:
    """Existing workspace entries a no-access glob matches (not below a match or a masked path)."""
    found: list[tuple[str, str]] = []
    budget = [MAX_GLOB_WALK]
    dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

    def walk(dfd: int, prefix: str) -> None:
        with os.scandir(dfd) as it:
            entries = sorted(it, key=lambda e: e.name)
        budget[0] -= len(entries)
        if budget[0] < 0:
            raise PolicyViolation(f"more than {MAX_GLOB_WALK} workspace entries: too many to expand no-access globs")
        for e in entries:
            rel = f"{prefix}/{e.name}" if prefix else e.name
            if p.ws_levels.get(rel) is Access.NONE:
                continue
            st = e.stat(follow_symlinks=False)
            if policy.glob_hit(rel):
                if not stat.S_ISLNK(st.st_mode):
                    found.append((rel, "dir" if stat.S_ISDIR(st.st_mode) else "file"))
            elif stat.S_ISDIR(st.st_mode):
                try:
                    sub = os.open(e.name, dir_flags, dir_fd=dfd)
                except OSError:
                    continue  # swapped for a link since the listing: never followed
                try:
                    walk(sub, rel)
                finally:
                    os.close(sub)

    top = os.open(p.root, dir_flags)
    try:
        walk(top, "")
    finally:
        os.close(top)
    if len(found) > MAX_GLOB_MASKS:
        raise PolicyViolation(f"no-access globs match {len(found)} entries, more than {MAX_GLOB_MASKS} can be masked")
    return found


def _plan_workspace(p: _Plan, res: Resolver) -> None:
    ws_targets = [t for t in res.targets if t.rel is not None]
    root_t = ws_targets[0]
    if root_t.access is Access.NONE:
        p.mask(p.ws_ops, SANDBOX_WORKSPACE, 0, "dir", traversable=_opened_below(root_t.path, res.targets))
    else:
        p.bind(p.ws_ops, p.root, SANDBOX_WORKSPACE, 0, root_t.access)
    p.ws_levels["."] = root_t.access
    for t in ws_targets[1:]:
        assert t.rel is not None
        if res.policy.glob_hit(t.rel):
            continue  # under a glob match: a hard deny, masked below
        _ws_rule(p, t, res.targets)
    if res.policy.no_access_globs:
        for rel, kind in _glob_matches(p, res.policy):
            _pin_ws(p, rel)
            p.mask(p.ws_ops, _ws_dest(rel), len(path_parts(rel)), kind)


@dataclass(frozen=True, slots=True)
class ProgramBind:
    """A workspace directory the sandbox also shows at another absolute path (``program_binds``)."""

    fd: int
    """The directory, opened by :func:`open_program_bind` (passed to bwrap, which binds the fd, not a path)."""
    path: str
    """Where the program sees it (``/home/user``)."""
    rel: str
    """Its workspace path (``work``)."""


def open_program_bind(root: str, rel: str, owner: tuple[int, int] | None) -> int:
    """An fd of the workspace directory ``rel``, made (given to ``owner``) when missing, opened by a walk that
    never follows a link: the workspace is the program's, which may have swapped ``rel`` for a link to a host
    directory since its last run; bwrap binds this fd, so what the sandbox shows is what was checked.

    Raises:
        PathDenied: ``rel`` (or a directory on its way) is a symlink or not a directory, or cannot be opened.
    """
    try:
        with ConfinedRoot(root, owner) as cr:
            return cr.open_dir(rel.split("/"), create=True, display=rel)
    except PathDenied as exc:
        raise PathDenied(
            rel,
            f"{exc.reason}: the sandbox shows this directory at another path and binds only a real directory of "
            "the workspace; remove what is there (it is made again, empty) and retry",
        ) from None
    except OSError as exc:
        raise PathDenied(rel, f"cannot open it to show it at another path in the sandbox ({exc.strerror})") from None


def _plan_binds(p: _Plan, binds: Sequence[ProgramBind]) -> list[str]:
    """Each program bind as the workspace directory it shows is at ``/workspace``: the directory's fd bound with
    its access, then every workspace rule under it (masks, read-only paths, pins) again below the bind's path."""
    args: list[str] = []
    for b in binds:
        src = _ws_dest(b.rel)
        # the directory's own bind (by path, at /workspace) is the fd's here; its masks (a glob's) hold here too
        below = [op for op in sorted(p.ws_ops) if is_under(op.dest, src) and (op.mask or op.dest != src)]
        level = p.ws_level(b.rel)
        if level is Access.NONE:
            opened = any(not op.mask for op in below)
            args += ["--perms", "0111" if opened else "0000", "--tmpfs", b.path]
            p.remount.append(b.path)
        else:
            args += ["--bind-fd" if level.can_write else "--ro-bind-fd", str(b.fd), b.path]
        for op in below:
            dest = b.path + op.dest[len(src) :]
            args += [*op.args[:-1], dest]
            if op.dest in p.remount:
                p.remount.append(dest)
    return args


def _ensure_mask_file(root: str) -> None:
    with ConfinedRoot(root) as cr:
        dfd = cr.open_dir([INTERNAL_DIR], create=True)
        try:
            try:
                st = os.stat("denied", dir_fd=dfd, follow_symlinks=False)
                ok = stat.S_ISREG(st.st_mode) and st.st_size == 0 and stat.S_IMODE(st.st_mode) == 0 and st.st_nlink == 1
            except FileNotFoundError:
                ok = False
        finally:
            os.close(dfd)
        if not ok:
            cr.write_file(MASK_FILE, b"", 0o000)


def policy_mounts(
    res: Resolver,
    cwd_rel: str = "",
    *,
    held: PlaceholderRun,
    hidden: Sequence[Path] = (),
    shown: Collection[str] = (),
    binds: Sequence[ProgramBind] = (),
    system_root: str | None = None,
    stage: GrantSource | None = None,
) -> list[str]:
    """The bwrap arguments enforcing a policy (resolved for the workspace at ``res.root``, a real
    path): host grants and denials, then the workspace at ``/workspace`` with its own rules and
    the glob denials; each tree shallow to deep, so the most specific rule is mounted last; then the program
    ``binds``, each with the rules of the workspace directory it shows. ``hidden``: host directories masked
    wherever the sandbox would see them; ``shown``: the only paths inside them a grant may name, read-only (the
    runtime environments the run uses, canonical). ``system_root``: a rootfs environment's root, which the
    sandbox shows at its system directories (host grants there need a place in it). ``stage``: where each host
    grant is bound from (:mod:`.grants`: its fd, or as root the grant helper's clone, from which the protected
    paths and pins inside it are bound too); None binds grants by their paths.

    Judges the host as it is now: call it right before the run. Side effects: creates transient placeholders
    for missing protected paths under writable workspace directories, held in ``held`` until the caller releases
    it once the run is over, even one that failed to start (a missing protected path of a host write grant gets
    none: ``held`` watches it instead); creates ``.execspace`` (mode 0555, kept) where it is missing under a
    writable root, and ``.execspace/denied``.

    Raises:
        SetupFailed: as root, the workspace lies under a directory its sandbox's uid cannot pass.
        PolicyViolation: a rule that cannot be enforced (a grant over /proc, or inside a
            ``hidden`` directory but for a read-only one of ``shown``, a missing no-access path the program
            could create, too many glob matches).
        PathDenied: a granted host path that does not exist; a symlink where a workspace
            rule must mount, or at a protected path; a cwd the policy hides.
    """
    if cwd_rel and not res.access(cwd_rel).can_read:
        raise PathDenied(cwd_rel, "the sandbox policy gives no access to the working directory")
    closed = closed_ancestor(res.root)
    if closed is not None:
        raise SetupFailed(
            "sandbox",
            f"as root each workspace's sandbox runs as its own uid, which cannot pass {closed} on the way to the "
            f"workspace {res.root}",
            "choose a workspace_root where every directory on the way is searchable by others (chmod o+x), "
            "or keep the default",
        )
    p = _Plan(res.root, _visible_top(system_root), held, system_root, stage)
    hidden_real = [os.path.realpath(h) for h in hidden]
    for t in res.targets:
        if t.rel is None and t.protected:
            _host_protected(p, t)
        elif t.rel is None and t.access.can_read:
            _host_grant(p, t, hidden_real, shown)
        elif t.rel is None:
            _host_denial(p, t, res.targets)
    for h in (*hidden_real, res.root):
        _hide(p, h)
    _plan_workspace(p, res)
    if p.mask_file:
        _ensure_mask_file(res.root)
    # a bind host grants lie under (the workspace's tmp/ at /tmp) first: they are mounted in it, not under it
    under = [b for b in binds if any(is_under(op.dest, b.path) for op in p.host_ops)]
    args = _plan_binds(p, under)
    args += [a for op in sorted(p.host_ops) for a in op.args]
    args += [a for op in sorted(p.ws_ops) for a in op.args]
    args += _plan_binds(p, [b for b in binds if b not in under])
    for dest in p.remount:
        args += ["--remount-ro", dest]
    return args


def data_fd(data: bytes, name: str = "execspace-bwrap-data") -> int:
    """An fd bwrap reads ``data`` from (``--ro-bind-data``), positioned at its start."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
