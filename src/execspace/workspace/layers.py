"""Copy-on-write workspaces: a kernel overlay over frozen snapshot layers (root only, ``fork: "cow"``).

::

    <root>/<name>/                 the workspace: an overlay mount (lowers = snapshot trees, upper = its changes)
    <root>/.layers/<name>/upper/   the branch's own changes (overlay format: 0/0 whiteouts, opaque dirs)
    <root>/.layers/<name>/work/    the overlay's work directory
    <root>/.layers/<name>/layers.json   {"chain": [snapshot ids, top first]}

The host mounts the overlay itself, at the workspace's own path, so every host-side file operation (the
confined file API, staging, collection, the sandbox's bind of the workspace) goes through the kernel's merged
view with its usual rules: whiteouts and opaque directories are the kernel's, copy-up is the kernel's, a link
is never followed by the confined walks. Only root may do this (the host never mounts anything as a normal
user): there, and where the kernel refuses, forks are copies (:mod:`.snapshots`).

The overlay is mounted ``nosuid,nodev`` with ``metacopy``, ``redirect_dir``, ``index`` and ``xino`` off:
every copied-up file is whole in the upper, a renamed directory is copied (``EXDEV`` to the program, which
``mv`` handles), so a layer is plain files that can be copied, frozen and shared.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from ..errors import SetupFailed
from .confine import remove_tree
from .confinecore import DIR_FLAGS

__all__ = [
    "LAYERS_DIR",
    "chain_of",
    "merged_view",
    "mount_overlay",
    "overlay_ready",
    "own_changes",
    "remove_layers",
    "unmount",
]

LAYERS_DIR = ".layers"
_RECORD = "layers.json"
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_RDONLY = 1
_MNT_DETACH = 2
_OPTIONS = "index=off,xino=off,redirect_dir=off,metacopy=off"
#: Mount data is one page: the lower paths must fit (a longer chain is flattened first).
MAX_MOUNT_DATA = 3800
_UNSAFE_PATH = (",", ":", "\\", "=")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)  # libc, already loaded (find_library would run ldconfig)


def layers_dir(ws_dir: Path) -> Path:
    return ws_dir.parent / LAYERS_DIR / ws_dir.name


def chain_of(ws_dir: Path) -> list[str] | None:
    """The snapshot ids under the workspace's overlay (top first), or None when it is a plain directory."""
    try:
        fd = os.open(layers_dir(ws_dir) / _RECORD, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        chain = json.loads(f.read(1024 * 1024))["chain"]
    return [str(c) for c in chain]


def write_record(layer_dir: Path, chain: list[str]) -> None:
    fd = os.open(layer_dir / _RECORD, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"chain": chain}, f)


def own_changes(ws_dir: Path) -> Path:
    """Where the workspace's own bytes are: the overlay's upper for a fork, else the workspace itself (what
    ``max_disk_bytes`` counts: a branch pays for its changes, not for the snapshot it shares)."""
    upper = layers_dir(ws_dir) / "upper"
    return upper if chain_of(ws_dir) is not None else ws_dir


def mount_data(lowers: list[Path], upper: Path, work: Path) -> bytes:
    paths = [*lowers, upper, work]
    if any(c in str(p) for p in paths for c in _UNSAFE_PATH):
        raise SetupFailed("fork", f"the workspace root {upper.parents[2]} holds , : = or \\", "use another root")
    lower = ":".join(map(str, lowers))
    return f"lowerdir={lower},upperdir={upper},workdir={work},{_OPTIONS}".encode()


def mount_overlay(ws_dir: Path, lowers: list[Path]) -> None:
    """Mount the workspace's overlay at ``ws_dir`` unless it already is (another manager did)."""
    if os.path.ismount(ws_dir):
        return
    layer_dir = layers_dir(ws_dir)
    data = mount_data(lowers, layer_dir / "upper", layer_dir / "work")
    if len(data) > MAX_MOUNT_DATA:
        raise SetupFailed("fork", f"the layers of {ws_dir} do not fit one mount", "snapshot it again to flatten")
    rc = _libc().mount(b"overlay", os.fsencode(ws_dir), b"overlay", _MS_NOSUID | _MS_NODEV, data)
    if rc != 0:
        err = ctypes.get_errno()
        raise SetupFailed("fork", f"cannot mount the overlay of {ws_dir}: {os.strerror(err)}", "see `execspace doctor`")


@contextlib.contextmanager
def merged_view(lowers: list[Path], mount_point: Path) -> Iterator[Path]:
    """The layers ``lowers`` (top first) merged, read-only, at ``mount_point`` for the block: how a manager that
    forks by copies reads a layered snapshot (root only, as layered snapshots are made by root)."""
    mount_point.mkdir(mode=0o700)
    data = f"lowerdir={':'.join(map(str, lowers))},{_OPTIONS}".encode()
    if any(c in str(p) for p in lowers for c in _UNSAFE_PATH) or len(data) > MAX_MOUNT_DATA:
        raise SetupFailed("fork", f"the layers under {mount_point} cannot be mounted", "use another root")
    flags = _MS_NOSUID | _MS_NODEV | _MS_RDONLY
    if _libc().mount(b"overlay", os.fsencode(mount_point), b"overlay", flags, data) != 0:
        err = ctypes.get_errno()
        raise SetupFailed(
            "fork",
            f"this snapshot is layered (made copy-on-write) and cannot be read here: {os.strerror(err)}",
            "fork or restore it as root, with the local or sandbox backend",
        )
    try:
        yield mount_point
    finally:
        unmount(mount_point)


def unmount(ws_dir: Path) -> None:
    """Detach the workspace's overlay (programs still holding it keep their view until they end)."""
    if os.path.ismount(ws_dir):
        rc = _libc().umount2(os.fsencode(ws_dir), _MNT_DETACH)
        if rc != 0:
            err = ctypes.get_errno()
            raise SetupFailed("fork", f"cannot unmount {ws_dir}: {os.strerror(err)}", "stop what uses it and retry")


def remove_layers(ws_dir: Path) -> bool:
    """Unmount a fork and remove its own layers (the snapshots it shares are the store's); False when
    ``ws_dir`` is a plain workspace."""
    if chain_of(ws_dir) is None:
        return False
    unmount(ws_dir)
    parent = os.open(layers_dir(ws_dir).parent, DIR_FLAGS)
    try:
        remove_tree(parent, ws_dir.name, str(layers_dir(ws_dir)))
    finally:
        os.close(parent)
    return True


def overlay_ready(scratch: Path) -> bool:
    """Whether this process can mount an overlay here (root, and a kernel that has it): tried in ``scratch``
    (made, then removed)."""
    if os.geteuid() != 0 or any(c in str(scratch) for c in _UNSAFE_PATH):
        return False
    dirs = [scratch / d for d in ("lower", "upper", "work", "merged")]
    try:
        for d in [scratch, *dirs]:
            d.mkdir(mode=0o700)
        data = mount_data([dirs[0]], dirs[1], dirs[2])
        ok: bool = _libc().mount(b"overlay", os.fsencode(dirs[3]), b"overlay", _MS_NOSUID | _MS_NODEV, data) == 0
        if ok:
            _libc().umount2(os.fsencode(dirs[3]), _MNT_DETACH)
        return ok
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            parent = os.open(scratch.parent, DIR_FLAGS)
            try:
                remove_tree(parent, scratch.name, str(scratch))
            finally:
                os.close(parent)


def copy_root_attrs(src: int, dst: int) -> None:
    """Give the directory fd ``dst`` the owner, mode and ``trusted.execspace.*`` attributes of ``src``: a fork's
    upper is its workspace root, which must be the snapshot's (the sandbox keeps its uid in such an attribute)."""
    st = os.fstat(src)
    os.fchown(dst, st.st_uid, st.st_gid)
    os.fchmod(dst, stat.S_IMODE(st.st_mode))
    for name in os.listxattr(src):
        if name.startswith("trusted.execspace."):
            os.setxattr(dst, name, os.getxattr(src, name))
