"""Warm pool slots: directories prepared ahead that become new workspaces by an atomic rename.

Something pre-started for a workspace (a container's bind mount, a sandbox's ``/workspace`` bind and its
uid) is fixed to a directory when it starts, so a pool cannot start it in a workspace created later. A slot
is therefore a fresh directory inside the workspace root, named ``.pool-<random>`` (no workspace id
sanitises to a leading dot), and handing it out renames it to the new workspace's name: binds follow the
directory, and the rename is atomic (same filesystem). It only happens when the workspace directory does
not exist yet, so a slot belongs to exactly one workspace and is never returned to a pool once handed out.

A slot made by :func:`new_slot_dir` records its owner (:mod:`execspace.owner`) in a file inside it,
removed when the slot becomes a workspace; :func:`sweep_stale_slots` removes the slots of owners that are
provably gone (a crashed process never removed its pool).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, TypeVar

from ..owner import Owner, current_owner, owner_alive
from .layout import ensure_layout

__all__ = [
    "OWNER_FILE",
    "SLOT_PREFIX",
    "HasHostDir",
    "SlotPool",
    "adopt_slot_dir",
    "is_slot_dir",
    "laid_out_slot",
    "new_slot_dir",
    "sweep_stale_slots",
    "take_slot",
]

SLOT_PREFIX = ".pool-"
#: Inside a slot made by :func:`new_slot_dir`: who made it. Never part of a workspace (removed on adoption).
OWNER_FILE = ".execspace-slot-owner.json"
_OWNER_PREFIX = "slot"


class HasHostDir(Protocol):
    @property
    def host_dir(self) -> Path: ...


S = TypeVar("S", bound=HasHostDir)


class SlotPool(Protocol[S]):
    """What :func:`take_slot` needs of a pool (:class:`execspace.process.warmpool.WarmPool` has it)."""

    def take(self) -> S | None: ...

    def give_back(self, item: S, /) -> None: ...


def new_slot_dir(root: Path, mode: int = 0o700) -> Path:
    """Create a fresh slot directory in ``root`` (an absolute path), holding only the record of its owner."""
    slot_dir = root.absolute() / f"{SLOT_PREFIX}{secrets.token_hex(8)}"
    slot_dir.mkdir(mode=mode)
    fd = os.open(slot_dir / OWNER_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(current_owner().fields(_OWNER_PREFIX), f)
    return slot_dir


@contextlib.contextmanager
def laid_out_slot(root: Path) -> Iterator[Path]:
    """A new slot in ``root`` with a workspace's layout, for the block to finish (its owner, what is started
    in it); removed again if the block raises, so a failed fill leaves nothing in the root. Its metadata is
    written when it becomes a workspace (which names it)."""
    slot_dir = new_slot_dir(root)
    try:
        ensure_layout(slot_dir)
        yield slot_dir
    except BaseException:
        shutil.rmtree(slot_dir, ignore_errors=True)
        raise


def sweep_stale_slots(root: Path) -> list[Path]:
    """Remove the slots in ``root`` whose owner is provably gone; return them. Slots of live owners, of
    owners we cannot judge, and without a readable record stay."""
    here = current_owner()
    swept: list[Path] = []
    with contextlib.suppress(FileNotFoundError), os.scandir(root) as entries:
        for entry in entries:
            if not (entry.name.startswith(SLOT_PREFIX) and entry.is_dir(follow_symlinks=False)):
                continue
            owner = _slot_owner(Path(entry.path))
            if owner is not None and owner_alive(owner, here) is False:
                shutil.rmtree(entry.path, ignore_errors=True)
                swept.append(Path(entry.path))
    return swept


def _slot_owner(slot_dir: Path) -> Owner | None:
    try:
        fd = os.open(slot_dir / OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd) as f:
            fields = json.load(f)
    except (OSError, ValueError):
        return None
    return Owner.from_fields(_OWNER_PREFIX, fields) if isinstance(fields, dict) else None


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
    with contextlib.suppress(FileNotFoundError):  # a workspace now: no longer a slot to sweep
        (ws_dir / OWNER_FILE).unlink()
    return True


def take_slot(pool: SlotPool[S], ws_dir: Path) -> S | None:
    """A pooled slot renamed to the new workspace ``ws_dir``, or None (the pool keeps its slots) if none is ready
    or ``ws_dir`` exists already (a reopened session's directory never gets a slot renamed over it)."""
    if ws_dir.exists():
        return None
    slot = pool.take()
    if slot is None:
        return None
    if adopt_slot_dir(slot, ws_dir):
        return slot
    pool.give_back(slot)
    return None
