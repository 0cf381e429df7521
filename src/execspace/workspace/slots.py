"""Warm pool slots: directories prepared ahead that become new workspaces by an atomic rename.

Something pre-started for a workspace (a container's bind mount, a sandbox's ``/workspace`` bind and its
uid) is fixed to a directory when it starts, so a pool cannot start it in a workspace created later. A slot
is therefore a fresh directory inside the workspace root, named ``.pool-<random>`` (no workspace id
sanitises to a leading dot), and handing it out renames it to the new workspace's name: binds follow the
directory, and the rename is atomic (same filesystem). It only happens when the workspace directory does
not exist yet, so a slot belongs to exactly one workspace and is never returned to a pool once handed out.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Protocol

__all__ = ["SLOT_PREFIX", "HasHostDir", "adopt_slot_dir", "is_slot_dir", "new_slot_dir"]

SLOT_PREFIX = ".pool-"


class HasHostDir(Protocol):
    @property
    def host_dir(self) -> Path: ...


def new_slot_dir(root: Path, mode: int = 0o700) -> Path:
    """Create a fresh, empty slot directory in ``root`` (an absolute path)."""
    slot_dir = root.absolute() / f"{SLOT_PREFIX}{secrets.token_hex(8)}"
    slot_dir.mkdir(mode=mode)
    return slot_dir


def is_slot_dir(path: Path) -> bool:
    """Whether ``path`` is named like a slot (so never a directory that became a workspace)."""
    return path.name.startswith(SLOT_PREFIX)


def adopt_slot_dir(slot: HasHostDir, ws_dir: Path) -> bool:
    """Make the slot's directory ``ws_dir``; ``False`` (slot untouched) if ``ws_dir`` exists already.

    ``rename`` replaces an empty directory, so we create ``ws_dir`` ourselves first: if that
    fails it was someone else's, and if another process fills it meanwhile the rename fails.
    """
    try:
        ws_dir.mkdir(mode=0o700)
    except FileExistsError:
        return False
    try:
        os.rename(slot.host_dir, ws_dir)
    except OSError:
        with contextlib.suppress(OSError):
            ws_dir.rmdir()
        return False
    return True
