"""The workspaces left on this host: listed, shown and removed by ``execspace ws`` without opening a backend.

A workspace is a directory (never a link) right under a workspace root holding a ``metadata.json``; nothing else
under the root is ever touched. Listing reads the record without repairing it (a corrupt one is reported, not moved
aside), and removal goes by directory fds as a backend's cleanup does (no link in the tree is followed).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import PathDenied, WorkspaceNotFound
from .confine import ConfinedRoot
from .hostmanager import remove_workspace_tree
from .layout import METADATA_FILE
from .metadata import WorkspaceMetadata

__all__ = ["StoredWorkspace", "find_stored", "remove_stored", "stored_workspaces"]

#: Bytes of a record read for listing (records are small; a huge one is reported as unreadable).
_RECORD_BYTES = 1024 * 1024
#: Top-level entries whose mtime says the workspace was used (a run, a staged input, an output).
_ACTIVITY = ("", "runs", "work", "out", METADATA_FILE)


@dataclass(frozen=True, slots=True)
class StoredWorkspace:
    path: Path
    id: str
    """The logical id its record names ("" when the record cannot be read)."""
    created_at: float
    last_used: float
    """The newest of the record's update time and the mtimes of the root, runs/, work/, out/ and the record."""
    problem: str = ""
    """Why the record could not be read, when it could not."""


def stored_workspaces(root: Path) -> list[StoredWorkspace]:
    """The workspaces directly under ``root``, oldest use first."""
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    found = [ws for name in names if (ws := _stored(root / name)) is not None]
    return sorted(found, key=lambda ws: ws.last_used)


def _stored(path: Path) -> StoredWorkspace | None:
    try:
        if not stat.S_ISDIR(path.lstat().st_mode):
            return None
        fd = os.open(path / METADATA_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # not a workspace (or not ours to read)
    with os.fdopen(fd, "rb") as f:
        raw = f.read(_RECORD_BYTES)
    last_used = max((_mtime(path / entry) for entry in _ACTIVITY), default=0.0)
    try:
        meta = WorkspaceMetadata.from_json(raw)
    except ValueError as exc:
        return StoredWorkspace(path, "", last_used, last_used, problem=f"unreadable {METADATA_FILE}: {exc}")
    return StoredWorkspace(path, meta.id, meta.created_at, max(last_used, meta.updated_at))


def _mtime(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:
        return 0.0


def find_stored(roots: list[Path], key: str) -> list[StoredWorkspace]:
    """The workspaces that ``key`` names: a workspace directory (an absolute path, or one starting with ``.``), or
    else a logical id, which may hold slashes (``app/user/session``: every workspace with that id).

    Raises:
        WorkspaceNotFound: none does.
    """
    candidate = Path(key).expanduser()
    if candidate.is_absolute() or key.startswith((".", "~")):
        ws = _stored(candidate.absolute())
        if ws is None or ws.path.parent.resolve() not in {r.resolve() for r in roots}:
            raise WorkspaceNotFound(
                f"{key} is not a workspace under {', '.join(map(str, roots))}: "
                "`execspace ws list` shows them (--root DIR names another root)"
            )
        return [ws]
    matches = [ws for root in roots for ws in stored_workspaces(root) if ws.id == key]
    if not matches:
        raise WorkspaceNotFound(f"no workspace with id {key!r}: `execspace ws list` shows them")
    return matches


def remove_stored(ws: StoredWorkspace) -> None:
    """Remove the workspace's tree by fds; refused when its directory was swapped for something else meanwhile."""
    if _stored(ws.path) is None:
        raise PathDenied(str(ws.path), "it is no longer a workspace directory (changed since it was listed)")
    remove_workspace_tree(ws.path)


@dataclass(frozen=True, slots=True)
class StoredDetails:
    """What ``execspace ws show`` tells of one workspace beyond its listing, read by fds (links never followed)."""

    disk_bytes: int
    runs: int
    """Run directories under ``runs/``."""
    outputs: tuple[str, ...]
    """Files under ``out/`` (the first :data:`SHOWN_OUTPUTS`)."""
    more_outputs: int


SHOWN_OUTPUTS = 50


def stored_details(ws: StoredWorkspace) -> StoredDetails:
    with ConfinedRoot(str(ws.path)) as cr:
        runs = sum(1 for rel, _st, _ in cr.scan(["runs"]) if rel.count("/") == 1)
        outs = [rel for rel, st, _ in cr.scan(["out"]) if stat.S_ISREG(st.st_mode)]
        return StoredDetails(cr.disk_usage(), runs, tuple(outs[:SHOWN_OUTPUTS]), max(len(outs) - SHOWN_OUTPUTS, 0))
