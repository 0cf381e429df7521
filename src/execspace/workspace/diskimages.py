"""Disk-bounded workspaces: each on a filesystem of its own size (root only).

::

    <root>/<name>/               the workspace: the mount point of its image's filesystem
    <root>/.disks/               0700, the host's only: no sandbox uid may enter it
    <root>/.disks/<name>.img     the image: a sparse file formatted ext4, loop-mounted at the workspace

A write past the size fails in the program with ``ENOSPC`` ("No space left on device"); the workspace and every
other one go on. The image is made (sparse: it takes the blocks written, not its size) and mounted before the
workspace's layout, so that everything of the workspace lies on it; a workspace whose image exists but is not
mounted (the host rebooted) is mounted again when a manager opens it, as a fork's overlay is (and removed then if
it was never laid out: see ``HostWorkspaceManager.get_workspace``). Removing the
workspace detaches the mount first (``MNT_DETACH``: a process still holding it keeps its view until it ends, and
the tree removed below is the empty mount point, never the filesystem's contents through a mount), then deletes the
image; the loop device frees itself (``mount -o loop`` sets autoclear) once the last user is gone.

The filesystem is ext4 without a journal (nothing of a workspace outlives a crash of its host more than its
files do); its own metadata takes a few percent of the size, and 1 % is reserved for the host's root, which no
program of a sandbox is: a sandbox that filled its disk still gets the run directory of its next command (made by
the host in machine mode), so it can run ``rm`` to free space.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from ..errors import SetupFailed
from .layers import unmount

__all__ = [
    "DISKS_DIR",
    "MIN_DISK_BYTES",
    "disk_tools_missing",
    "ensure_disk_mounted",
    "image_of",
    "make_disk",
    "remove_disk",
]

DISKS_DIR = ".disks"
_TOOLS = ("mkfs.ext4", "mount")
_MKFS_OPTIONS = ("-q", "-F", "-m", "1", "-O", "^has_journal", "-E", "lazy_itable_init=1,lazy_journal_init=1")
_MOUNT_OPTIONS = "loop,nosuid,nodev,noatime"
#: Smallest image mkfs.ext4 makes a usable filesystem of.
MIN_DISK_BYTES = 1024 * 1024


def disk_tools_missing() -> str | None:
    """Why this process cannot bound a workspace's disk here (root, the tools, loop devices), or None."""
    if os.geteuid() != 0:
        return "a workspace's disk bound is a filesystem the host mounts: run as root"
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found: apt-get install e2fsprogs mount"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices (/dev/loop-control): load the loop module (modprobe loop)"
    return None


def image_of(ws_dir: Path) -> Path:
    return ws_dir.parent / DISKS_DIR / f"{ws_dir.name}.img"


def make_disk(ws_dir: Path, size: int) -> None:
    """Put the empty directory ``ws_dir`` on a new filesystem of ``size`` bytes (mode 0700, root's)."""
    image = image_of(ws_dir)
    with contextlib.suppress(FileExistsError):
        image.parent.mkdir(mode=0o700)
    try:
        fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
        _tool("mkfs.ext4", *_MKFS_OPTIONS, str(image))
        _mount(image, ws_dir)
    except BaseException:
        with contextlib.suppress(OSError, SetupFailed):
            remove_disk(ws_dir)
        raise
    os.chmod(ws_dir, 0o700)
    with contextlib.suppress(FileNotFoundError):  # mkfs's; a workspace shows only its own files
        os.rmdir(ws_dir / "lost+found")


def ensure_disk_mounted(ws_dir: Path) -> None:
    """Mount the workspace's image again where it is not (after a reboot); nothing for an unbounded workspace."""
    image = image_of(ws_dir)
    if image.exists() and not os.path.ismount(ws_dir):
        _mount(image, ws_dir)


def remove_disk(ws_dir: Path) -> bool:
    """Detach the workspace's filesystem and delete its image; False when it has none."""
    image = image_of(ws_dir)
    if not image.exists():
        return False
    unmount(ws_dir)
    image.unlink(missing_ok=True)
    return True


def _mount(image: Path, ws_dir: Path) -> None:
    _tool("mount", "-t", "ext4", "-o", _MOUNT_OPTIONS, str(image), str(ws_dir))


def _tool(*argv: str) -> None:
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, check=False)
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
        raise SetupFailed("workspace disk", f"{argv[0]} failed: {said}", "see `execspace doctor`; free a loop device")
