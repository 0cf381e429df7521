"""Machine mode of the sandbox (``SandboxOptions(machine=True)``): the machine E2B's code expects.

The program runs as ``user`` (uid 1000, a passwd entry, ``HOME=/home/user``, the workspace's ``work/`` there) and
``sudo`` makes it the root of the sandbox's own user namespace, in which uid 0 is the host's :func:`machine_uid`
and uid 1000 the workspace's :func:`~.bwrap.sandbox_uid` (both unprivileged on the host). The system is writable
through overlays whose upper layers are the workspace's (:data:`MACHINE_DIR`):

* **trees execspace built** (the runtime environment's tree, a rootfs environment's system directories): their
  lower is an idmapped clone, so the files the host's root owns there are root's inside; ``sudo pip install``
  changes them (in the upper layer);
* **the host's own system directories** (``/usr``, ``/etc``, ``/var``, ``/opt``…): their lower keeps its host
  owners, so a host file stays exactly as readable as without machine mode (``/etc/shadow`` stays unreadable:
  owning the host's files would let root inside read every file the host keeps from others). The directories
  of ``/etc``, ``/opt``, ``/var`` and ``/usr/local`` others may list are root's inside (empty copies in the
  layer's seed, a tree shared by every sandbox below its own upper layer), but for a runtime environment's tree
  (the store under ``/var``): root adds, replaces and removes entries there; a host file itself is never written
  in place (``sed -i`` replaces it, ``>>`` is refused).

The host's root starts bwrap through the machine helper (``machine.c``), which makes the namespace and the
overlays and enters it as its root; bwrap then runs privileged inside it (no user namespace of its own), keeping
only ``CAP_SETUID`` and ``CAP_SETGID`` for ``setpriv``, which starts the program as ``user``; ``sudo`` is
``setpriv --reuid=0`` (a shim in the seed of ``/usr``). ``no_new_privs`` holds from bwrap on, so root inside
keeps only those two capabilities: it owns the system files, nothing more.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ...environments import MARKER as ENVIRONMENT_MARKER
from ...errors import CapabilityError
from ...process.preparation import PreparedRun
from ...process.supervisor import Launch
from ...workspace.confine import ConfinedRoot
from ...workspace.protected import INTERNAL_DIR
from ...workspace.treecopy import LAYERS_XATTR
from .bwrap import SYSTEM_TOP, machine_uid, sandbox_uid

__all__ = [
    "HOME",
    "MACHINE_DIR",
    "MACHINE_USERS",
    "USER_ID",
    "USER_NAME",
    "Layer",
    "Machine",
    "machine_env",
    "runs_as_user",
    "user_argv",
]

#: Where a workspace keeps its machine's upper layers: ``<name>/upper`` and ``<name>/work`` per layer (host root's,
#: 0700: neither a program nor another host user reaches them but through the overlay).
MACHINE_DIR = f"{INTERNAL_DIR}/machine"
USER_NAME = "user"
USER_ID = 1000
HOME = "/home/user"
ROOT_NAME = "root"
ROOT_HOME = "/root"
#: The users a machine sandbox's run may name (``RunProgramSpec.user``).
MACHINE_USERS = (USER_NAME, ROOT_NAME)
#: The directories of the host's own trees made root's inside (see the module): a layer's top for ``etc``,
#: ``opt``, ``var``; only ``local`` of ``usr``.
_WRITABLE_DIRS = {"etc": "", "opt": "", "var": "", "usr": "local"}
#: At most this many directories of one layer are made root's (what a host has there is usually a few hundred).
_MAX_WRITABLE_DIRS = 4096
#: The directories of a runtime environment's tree made ``user``'s (with each ``lib/python*/site-packages``).
_USER_DIRS = ("bin", "share", "include")
#: What a machine's ``/etc/hosts`` adds: the sandbox's host name (``execspace``, bwrap's ``--hostname``) with a
#: domain, so that what asks for the host's full name gets one (git's identity from passwd: ``user@execspace.local``).
_HOSTS_LINE = b"127.0.1.1\texecspace.local execspace\n"
_MAX_DEPTH = 24
#: Names E2B's templates have that a distribution may have only with a version (:func:`_plain_names`).
_PLAIN_NAMES = (("python", "python3"), ("pip", "pip3"))
#: The file by which a distribution's python refuses ``pip install`` outside a virtual environment (PEP 668).
_PEP668_MARKER = "EXTERNALLY-MANAGED"

_SUDO = """#!/bin/sh
# sudo of an execspace machine: root is the sandbox's own (its user namespace), without a password
user=0
while [ $# -gt 0 ]; do
  case "$1" in
    -u) shift; user="$1"; shift ;;
    -u*) user="${1#-u}"; shift ;;
    --user=*) user="${1#--user=}"; shift ;;
    -n|-E|-H|-S|-k|-i|-s|-P|--non-interactive|--preserve-env|--preserve-env=*|--login|--shell|--set-home) shift ;;
    --) shift; break ;;
    -*) echo "sudo: option $1 is not supported in this sandbox" >&2; exit 1 ;;
    *) break ;;
  esac
done
case "$user" in
  0|root|'#0') user=0 ;;
  1000|user|'#1000') user=1000 ;;
  *) echo "sudo: unknown user $user (this sandbox has root and user)" >&2; exit 1 ;;
esac
[ $# -gt 0 ] || set -- /bin/bash -l
if [ "$user" = 0 ]; then export HOME=/root USER=root LOGNAME=root
else export HOME=/home/user USER=user LOGNAME=user; fi
exec setpriv --reuid="$user" --regid="$user" --init-groups -- "$@"
"""


@dataclass(frozen=True, slots=True)
class Layer:
    """One overlay of a machine sandbox."""

    name: str
    """Its directory under :data:`MACHINE_DIR` of the workspace."""
    lower: str
    """The host tree it shows (read-only: changes go to the upper layer)."""
    dest: str
    """Where the sandbox shows it."""
    idmap: bool
    """The host root's files there are root's inside (a tree execspace built); else they keep their host owners."""
    top: str = ""
    """The system directory it is (``etc``, ``usr``…), or "" for a runtime environment's tree."""


def machine_env(env: dict[str, str], own: Sequence[str], user: str | None = None) -> dict[str, str]:
    """``env`` as the run's user has it (``user`` unless it names ``root``): its home, its name (unless the run
    sets them itself, ``own``)."""
    name, home = (ROOT_NAME, ROOT_HOME) if user == ROOT_NAME else (USER_NAME, HOME)
    mine = {"HOME": home, "USER": name, "LOGNAME": name}
    return {**env, **{k: v for k, v in mine.items() if k not in own}}


def runs_as_user(user: str | None) -> bool:
    """Whether a run naming ``user`` starts as ``user`` (every run but root's)."""
    return user != ROOT_NAME


#: What user (and root after sudo: no_new_privs keeps what it had) may do beyond a plain uid: change uid and gid
#: (sudo), and read and search every file of the sandbox's own uids (root's way into the user's workspace, whose
#: directories are the user's). A capability of the sandbox's user namespace: the host's files (owned by uids it
#: does not map) are out of its reach, as without it.
_USER_CAPS = "+setuid,+setgid,+dac_read_search"


def user_argv(setpriv: str, argv: Sequence[str]) -> list[str]:
    """``argv`` started as ``user``, allowed to become root (``sudo``) by ``CAP_SETUID``/``CAP_SETGID``."""
    return [
        setpriv,
        f"--reuid={USER_ID}",
        f"--regid={USER_ID}",
        "--init-groups",
        f"--inh-caps=-all,{_USER_CAPS}",
        f"--ambient-caps=-all,{_USER_CAPS}",
        "--",
        *argv,
    ]


class Machine:
    """What machine mode adds to a sandbox's run path: the layers of a view (:meth:`layers`), their binds in bwrap
    (:meth:`bwrap_binds`), and the step around bwrap (:meth:`around`), which the host's root runs."""

    def __init__(self, helper: Path, stage: Path, setpriv: str, seeds: Path) -> None:
        self.helper = helper
        self.stage = stage
        """A directory the helper mounts its own tmpfs over, in its own mount namespace (the overlays are there);
        every directory on its way is searchable by others, as bwrap runs as the sandbox's root."""
        self.setpriv = setpriv
        self.seeds = seeds
        """Where the layers' seeds are (the host root's, 0700): per layer, what every sandbox's upper layer would
        otherwise start with (:func:`_seed`), built once and shared read-only by every sandbox as a lower of its
        own between its upper layer and the layer's lower, named by a digest of what it holds."""
        self._layers: dict[tuple[str | None, str | None], tuple[Layer, ...]] = {}
        self._seeded: dict[str, str | None] = {}
        self._seeding = threading.Lock()  # starts in worker threads: each seed built once

    def layers(self, system_root: str | None, tree: str | None) -> tuple[Layer, ...]:
        """The layers of a view: the system directories (of ``system_root``, a rootfs environment, else of the
        host), then a venv environment's ``tree``."""
        key = (system_root, tree)
        found = self._layers.get(key)
        if found is None:
            found = self._layers[key] = _layers(system_root, tree)
        return found

    def merged(self, index: int) -> str:
        return f"{self.stage}/{index}"

    def bwrap_binds(self, layers: Sequence[Layer], system_root: str | None) -> list[str]:
        """The system directories as bwrap shows them: each layer's overlay where the host's would be bound,
        symlinks as they are, and ``/home`` for user's home, ``/root`` for root's."""
        root = system_root or "/"
        args: list[str] = []
        shown = {layer.top: i for i, layer in enumerate(layers) if layer.top}
        for entry in sorted(os.listdir(root)):
            if entry not in SYSTEM_TOP:
                continue
            if entry in shown:
                args += ["--bind", self.merged(shown[entry]), f"/{entry}"]
                continue
            with contextlib.suppress(OSError):
                path = os.path.join(root, entry)
                if stat.S_ISLNK(os.lstat(path).st_mode):
                    args += ["--symlink", os.readlink(path), f"/{entry}"]
        return [*args, "--perms", "0755", "--dir", "/home", "--perms", "0700", "--dir", "/root"]

    def tree_binds(self, layers: Sequence[Layer]) -> tuple[str, ...]:
        """A runtime environment's tree at its path (over the read-only bind the policy makes there)."""
        return tuple(
            a for i, layer in enumerate(layers) if not layer.top for a in ("--bind", self.merged(i), layer.dest)
        )

    def seed(self, workspace: Path, layers: Sequence[Layer]) -> None:
        """Make what :meth:`around` would make first: the layers' seeds (a few thousand directories of the host's
        system, once per process) and the workspace's empty layers, for a caller to do in a worker thread rather
        than on its event loop."""
        root = machine_uid(sandbox_uid(workspace))
        with ConfinedRoot(str(workspace)) as cr:
            for layer in layers:
                self.seed_of(layer)
                for fd in _layer_dirs(cr, layer, root):
                    os.close(fd)

    def seed_of(self, layer: Layer) -> str | None:
        """The path of ``layer``'s seed (built the first time), or None where it needs none."""
        with self._seeding:
            if layer.name not in self._seeded:
                self._seeded[layer.name] = _built_seed(self.seeds, layer)
            return self._seeded[layer.name]

    def around(self, prep: PreparedRun, launch: Launch, layers: Sequence[Layer]) -> Launch:
        """``launch`` (bwrap) started by the helper: the workspace's upper and work directories of each layer
        made if missing and opened without following a link, over the layer's seed; the helper gets the fds,
        which close once it is started."""
        user = sandbox_uid(prep.root)
        root = machine_uid(user)
        fds: list[int] = []
        args = [str(self.helper), str(root), str(user), str(self.stage)]
        try:
            with ConfinedRoot(str(prep.root)) as cr:
                for layer in layers:
                    seed = self.seed_of(layer) or "-"
                    upper, work = _layer_dirs(cr, layer, root)
                    fds += [upper, work]
                    args += ["idmap" if layer.idmap else "plain", seed, layer.lower, str(upper), str(work)]
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        for fd in fds:
            launch.stack.after_spawn(_closer(fd))
        return replace(launch, argv=[*args, "--", *launch.argv], pass_fds=(*launch.pass_fds, *fds))


def _closer(fd: int) -> Callable[[], None]:
    return lambda: os.close(fd)


def _layers(system_root: str | None, tree: str | None) -> tuple[Layer, ...]:
    root = system_root or "/"
    prefix = f"{os.path.basename(os.path.dirname(system_root))}-" if system_root else "host-"
    layers = []
    for entry in sorted(os.listdir(root)):
        path = os.path.join(root, entry)
        if entry in SYSTEM_TOP and stat.S_ISDIR(os.lstat(path).st_mode):
            layers.append(Layer(prefix + entry, _checked(path), f"/{entry}", system_root is not None, entry))
    if tree is not None:
        layers.append(Layer(f"env-{os.path.basename(tree)}", _checked(tree), tree, True))
    return tuple(layers)


def _checked(path: str) -> str:
    """``path``, if the overlay's options can name it."""
    if any(c in path for c in ",:\\\n="):
        raise CapabilityError(
            f"machine mode over {path!r}",
            "sandbox",
            "an overlay cannot name a lower directory with ',', ':', '=' or '\\' in its path: move it",
        )
    return path


def _layer_dirs(cr: ConfinedRoot, layer: Layer, root: int) -> tuple[int, int]:
    """The layer's upper and work directories (made the first time), opened."""
    base = [*MACHINE_DIR.split("/"), layer.name]
    try:
        upper = cr.open_dir([*base, "upper"])
    except FileNotFoundError:
        _make_layer(cr, layer, root)
        upper = cr.open_dir([*base, "upper"])
    try:
        work = cr.open_dir([*base, "work"], create=True)
    except BaseException:
        os.close(upper)
        raise
    return upper, work


def _make_layer(cr: ConfinedRoot, layer: Layer, root: int) -> None:
    """A new layer: its upper directory made root's under a temporary name, then renamed into place (a layer half
    made is never used); what it starts with is its seed's, below it."""
    machine = cr.open_dir(MACHINE_DIR.split("/"), create=True)
    try:
        os.fchmod(machine, 0o700)
        # snapshots and forks copy what is in it as overlay layers: whiteouts and opaque directories kept
        os.setxattr(machine, LAYERS_XATTR, b"1")
        base = _step_or_make(machine, layer.name)
    finally:
        os.close(machine)
    try:
        tmp = f".upper-{os.getpid()}-{threading.get_ident()}"
        with contextlib.suppress(FileNotFoundError):
            _remove_tree(base, tmp)
        os.mkdir(tmp, 0o755, dir_fd=base)
        ufd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=base)
        try:
            lower = os.stat(layer.lower)
            os.fchown(ufd, root, root)
            os.fchmod(ufd, stat.S_IMODE(lower.st_mode) & 0o1777)
        finally:
            os.close(ufd)
        with contextlib.suppress(FileExistsError):
            os.mkdir("work", 0o700, dir_fd=base)
        try:
            os.rename(tmp, "upper", src_dir_fd=base, dst_dir_fd=base)
        except OSError:  # made by a concurrent run meanwhile: theirs counts
            _remove_tree(base, tmp)
    finally:
        os.close(base)


def _built_seed(seeds: Path, layer: Layer) -> str | None:
    """``layer``'s seed in ``seeds``: :func:`_seed`'s tree with the host's root as root and uid 1000 as ``user``
    (the helper idmaps it into each sandbox), under a name its digest makes, so that a host whose system did not
    change reuses it and one that did gets a new one; None when it holds nothing."""
    seeds.mkdir(mode=0o700, exist_ok=True)
    os.chmod(seeds, 0o700)
    tmp = seeds / f".build-{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o755)
    fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _seed(fd, layer, 0, USER_ID)
        empty = not os.listdir(fd)
    finally:
        os.close(fd)
    if empty:
        tmp.rmdir()
        return None
    final = seeds / f"{layer.name}-{_tree_digest(tmp)}"
    try:
        tmp.rename(final)
    except OSError:  # there already (built before, or by a concurrent start): the same tree
        shutil.rmtree(tmp, ignore_errors=True)
    return _checked(str(final))


def _tree_digest(top: Path) -> str:
    """What a seed holds: each entry's path, type, mode, owner, device and bytes."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in sorted([*dirnames, *filenames]):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, top)
            digest.update(f"{rel}\0{st.st_mode}\0{st.st_uid}\0{st.st_gid}\0{st.st_rdev}\0".encode())
            if stat.S_ISREG(st.st_mode):
                digest.update(_read(path))
    return digest.hexdigest()[:16]


def _root_dirs(dfd: int, names: Sequence[str], root: int) -> int:
    """The directory ``names`` below ``dfd``, each on the way made (or taken as it is) root's and 0755, opened."""
    fd = dfd
    for name in names:
        nfd = _step_or_make(fd, name)
        if fd != dfd:
            os.close(fd)
        fd = nfd
        os.fchown(fd, root, root)
        os.fchmod(fd, 0o755)
    return fd


def _step_or_make(dfd: int, name: str) -> int:
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=dfd)
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)


def _seed(ufd: int, layer: Layer, root: int, user: int) -> None:
    """What a layer starts with (its seed): for ``etc``, passwd and group with ``user`` and hosts with the sandbox's
    name; for ``usr``, the sudo shim, ``python`` where only ``python3`` is, and no PEP 668 marker; for the host's
    own trees, the directories made root's (see the module); for a runtime environment's tree, the directories
    ``pip`` installs into made ``user``'s."""
    if not layer.idmap and layer.top in _WRITABLE_DIRS:
        _writable_dirs(ufd, layer, root)
    if not layer.top:
        _user_dirs(ufd, layer, root, user)
    if layer.top == "etc":
        for name, line in (
            ("passwd", f"{USER_NAME}:x:{USER_ID}:{USER_ID}:{USER_NAME}:{HOME}:/bin/bash\n"),
            ("group", f"{USER_NAME}:x:{USER_ID}:\n"),
        ):
            _write(ufd, name, _with_user(_read(os.path.join(layer.lower, name)), line), root, 0o644)
        hosts = _read(os.path.join(layer.lower, "hosts"))
        _write(ufd, "hosts", hosts + (b"\n" if hosts and not hosts.endswith(b"\n") else b"") + _HOSTS_LINE, root, 0o644)
    if layer.top == "usr":
        fd = _root_dirs(ufd, ("local", "bin"), root)
        try:
            _write(fd, "sudo", _SUDO.encode(), root, 0o755)
            _plain_names(fd, layer, root)
        finally:
            os.close(fd)
        _unmanaged(ufd, layer, root)


def _plain_names(bin_fd: int, layer: Layer, root: int) -> None:
    """``python`` and ``pip`` in ``/usr/local/bin`` where the system has only ``python3`` and ``pip3`` (Debian's):
    E2B's templates are python images, where both names run Python 3, and code written for them calls ``python``."""
    for name, versioned in _PLAIN_NAMES:
        has = [os.path.lexists(os.path.join(layer.lower, d, name)) for d in ("bin", "local/bin")]
        if not any(has) and os.path.exists(os.path.join(layer.lower, "bin", versioned)):
            os.symlink(f"/usr/bin/{versioned}", name, dir_fd=bin_fd)
            os.chown(name, root, root, dir_fd=bin_fd, follow_symlinks=False)


def _unmanaged(ufd: int, layer: Layer, root: int) -> None:
    """Whiteouts of the system python's ``EXTERNALLY-MANAGED`` markers (PEP 668): the system a sandbox sees is its
    own copy, so ``pip install`` there works as in E2B's templates (a python image's has no marker) and breaks at
    most this sandbox's packages; the host's file stays."""
    for entry in _subdirs(os.path.join(layer.lower, "lib")):
        if not entry.name.startswith("python3") or not os.path.isfile(os.path.join(entry.path, _PEP668_MARKER)):
            continue
        fd = _root_dirs(ufd, ("lib", entry.name), root)
        try:
            os.mknod(_PEP668_MARKER, stat.S_IFCHR | 0o600, os.makedev(0, 0), dir_fd=fd)  # overlayfs's whiteout
        finally:
            os.close(fd)


def _with_user(text: bytes, line: str) -> bytes:
    """passwd or group ``text`` with ``line`` for user instead of any entry of that name or id."""
    keep = [
        row
        for row in text.decode(errors="replace").splitlines()
        if row.split(":")[:1] != [USER_NAME] and row.split(":")[2:3] != [str(USER_ID)]
    ]
    return ("\n".join([*keep, ""]) + line).encode()


def _user_dirs(ufd: int, layer: Layer, root: int, user: int) -> None:
    """Upper copies, ``user``'s (group root, 0775), of the directories of a runtime environment's tree that ``pip
    install`` adds to (``bin``, ``share``, ``include``, each ``lib/python*/site-packages``): the user installs a
    package there without ``sudo``, as E2B's user does, and the kernels import it; what the environment has stays
    root's (upgrading or removing it takes ``sudo``), and every change is this workspace's upper layer's."""
    wanted = [d for d in _USER_DIRS if os.path.isdir(os.path.join(layer.lower, d))]
    with contextlib.suppress(OSError):
        wanted += [
            f"lib/{entry.name}/site-packages"
            for entry in _subdirs(os.path.join(layer.lower, "lib"))
            if entry.name.startswith("python") and os.path.isdir(os.path.join(entry.path, "site-packages"))
        ]
    for rel in wanted:
        fd, parts = ufd, rel.split("/")
        try:
            for i, name in enumerate(parts):
                lower = os.lstat(os.path.join(layer.lower, *parts[: i + 1]))
                if not stat.S_ISDIR(lower.st_mode):
                    break
                nfd = _step_or_make(fd, name)
                if fd != ufd:
                    os.close(fd)
                fd = nfd
                last = i == len(parts) - 1
                os.fchown(fd, user if last else root, root)
                os.fchmod(fd, 0o775 if last else stat.S_IMODE(lower.st_mode) & 0o1777)
        finally:
            if fd != ufd:
                os.close(fd)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20)
    except OSError:
        return b""


def _write(dfd: int, name: str, data: bytes, owner: int, mode: int) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
    try:
        os.write(fd, data)
        os.fchown(fd, owner, owner)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _writable_dirs(ufd: int, layer: Layer, root: int) -> None:
    """Empty copies, root's, of the lower's directories below the layer's writable part that anyone may list
    (and every directory on the way to them): the merged directory then is root's inside, its files the host's."""
    start = _WRITABLE_DIRS[layer.top]
    budget = [_MAX_WRITABLE_DIRS]
    # by path below the new upper layer: only this process has made anything there (it is not in place yet, under
    # a 0700 directory of the host's root), each parent before its children, so no component is a link
    for rel, st in _listable_dirs(layer.lower, start, budget):
        with contextlib.suppress(FileExistsError):  # on the way to the start directory
            os.mkdir(rel, 0o700, dir_fd=ufd)
        os.chown(rel, root, root, dir_fd=ufd, follow_symlinks=False)
        os.chmod(rel, stat.S_IMODE(st.st_mode) & 0o1777, dir_fd=ufd)


def _listable_dirs(lower: str, start: str, budget: list[int]) -> Iterator[tuple[str, os.stat_result]]:
    """Directories below ``lower/start`` (``start`` itself included, when given) that others may list and search,
    each after its parent, on the lower's filesystem."""
    top = os.stat(lower)
    pending = [start] if start else [entry.name for entry in _subdirs(lower)]
    while pending and budget[0] > 0:
        rel = pending.pop(0)
        path = os.path.join(lower, rel)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_dev != top.st_dev or st.st_mode & 0o005 != 0o005:
            continue
        if os.path.lexists(os.path.join(path, ENVIRONMENT_MARKER)):
            # a runtime environment's tree (the store is under /var): the run's own is a layer of its own over it,
            # another is nobody's to change; thousands of copies would only fill a small disk's inodes
            continue
        budget[0] -= 1
        yield rel, st
        if rel.count("/") < _MAX_DEPTH:
            pending += [f"{rel}/{entry.name}" for entry in _subdirs(path)]


def _subdirs(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return sorted((e for e in it if e.is_dir(follow_symlinks=False)), key=lambda e: e.name)
    except OSError:
        return []


def _remove_tree(dfd: int, name: str) -> None:
    shutil.rmtree(name, dir_fd=dfd)
