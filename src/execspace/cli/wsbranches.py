"""``execspace ws snapshot|snapshots|fork|restore``: snapshots and forks of the workspaces on this host, by the
same manager a backend uses (copy-on-write as root where overlays mount, plain copies elsewhere). Programs
still running in a workspace are not stopped from here: stop them first for an exact snapshot or restore."""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import SnapshotNotFound, UsageError
from ..models import Snapshot, Workspace
from ..workspace.hostmanager import HostWorkspaceManager
from ..workspace.stored import StoredWorkspace, find_stored
from .console import ago, human_size, print_json, printable, progress

__all__ = [
    "VERBS",
    "add_verbs",
    "branch_command",
    "find_snapshot",
    "old_snapshots",
    "remove_snapshots",
    "snapshot_line",
    "snapshot_row",
]

VERBS = ("snapshot", "snapshots", "fork", "restore")


def add_verbs(verbs: Any) -> None:
    snap = verbs.add_parser("snapshot", help="freeze a workspace's files as a snapshot")
    snap.add_argument("target", metavar="DIR|ID", help="the workspace")
    snap.add_argument("--name", help="a name to fork or restore it by")
    verbs.add_parser("snapshots", help="every snapshot, oldest first")
    fork = verbs.add_parser("fork", help="new workspaces starting from a workspace or a snapshot")
    fork.add_argument("source", metavar="DIR|ID|SNAPSHOT", help="a workspace, else a snapshot id or name")
    fork.add_argument("--count", type=int, default=1, help="how many (1-100)")
    fork.add_argument("--id", action="append", dest="ids", metavar="ID", help="the new ids (one per fork)")
    restore = verbs.add_parser("restore", help="bring a workspace's files back to a snapshot")
    restore.add_argument("target", metavar="DIR|ID", help="the workspace (its programs must be stopped)")
    restore.add_argument("snapshot", metavar="SNAPSHOT", help="a snapshot id or name")


def _manager(root: Path) -> HostWorkspaceManager:
    # the roots exist (an engine made them, or the user named a directory of theirs): never change their mode
    return HostWorkspaceManager(root.name, root, copy_on_write=True, keep_root_mode=True)


def _workspace(roots: list[Path], key: str) -> tuple[HostWorkspaceManager, Workspace]:
    found: list[StoredWorkspace] = find_stored(roots, key)
    if len(found) > 1:
        raise UsageError(f"{len(found)} workspaces have id {key!r}: name one by its directory")
    ws = found[0]
    manager = _manager(ws.path.parent)
    return manager, Workspace(id=ws.id, path=str(ws.path), backend=manager.backend, host_path=ws.path)


async def _snapshot(roots: list[Path], key: str) -> tuple[HostWorkspaceManager, Snapshot]:
    for root in roots:
        manager = _manager(root)
        try:
            return manager, await manager.get_snapshot(key)
        except SnapshotNotFound:
            continue
    raise SnapshotNotFound(f"no snapshot {key!r} under {', '.join(map(str, roots))}: `execspace ws snapshots`")


#: A snapshot found under a root, with the manager of that root (which removes it).
Found = tuple[HostWorkspaceManager, Snapshot]


async def find_snapshot(roots: list[Path], key: str) -> Found | None:
    """The snapshot of that id or name under the roots, or None."""
    try:
        return await _snapshot(roots, key)
    except SnapshotNotFound:
        return None


async def old_snapshots(roots: list[Path], older_than: float, now: float) -> list[Found]:
    """What ``ws gc`` collects: the snapshots without a name taken at least ``older_than`` seconds ago. A named
    snapshot is one kept on purpose (a base to fork from): only ``ws rm NAME`` removes it."""
    found = []
    for root in roots:
        manager = _manager(root)
        found += [(manager, s) for s in await manager.list_snapshots() if s.name is None]
    return [(m, s) for m, s in found if now - s.created_at >= older_than]


async def remove_snapshots(found: list[Found]) -> None:
    """Each is unlisted at once; what was forked or restored from it keeps working."""
    for manager, snap in found:
        await manager.remove_snapshot(snap)


def snapshot_row(snap: Snapshot) -> dict[str, object]:
    return {
        "id": snap.id,
        "name": snap.name,
        "workspace": snap.workspace,
        "parent": snap.parent,
        "created_at": round(snap.created_at, 3),
        "size": snap.size,
    }


def snapshot_line(snap: Snapshot, now: float) -> str:
    """One snapshot for a person: id, name, when it was taken (local time, and how long ago), size, workspace."""
    taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap.created_at))
    name = printable(snap.name) if snap.name else "-"
    of = printable(snap.workspace)
    return f"{snap.id}  {name:<16} {taken} ({ago(now - snap.created_at)} ago)  {human_size(snap.size):>9}  of {of}"


async def branch_command(args: argparse.Namespace, roots: list[Path]) -> int:
    now = time.time()
    if args.verb == "snapshots":
        snaps = sorted([s for root in roots for s in await _manager(root).list_snapshots()], key=lambda s: s.created_at)
        if args.json:
            print_json({"snapshots": [snapshot_row(s) for s in snaps]})
        else:
            progress(f"snapshots: {len(snaps) or 'none'}")
            print("".join(f"  {snapshot_line(s, now)}\n" for s in snaps), end="", flush=True)
        return 0
    if args.verb == "snapshot":
        manager, ws = _workspace(roots, args.target)
        snap = await manager.snapshot(ws, args.name)
        if args.json:
            print_json({"snapshot": snapshot_row(snap)})
        else:
            print(f"took {snapshot_line(snap, now)}", flush=True)
        return 0
    if args.verb == "restore":
        manager, ws = _workspace(roots, args.target)
        await manager.restore(ws, args.snapshot)
        return _show(args, {"restored": str(ws.host_path), "snapshot": args.snapshot})
    source: Workspace | Snapshot
    try:
        manager, source = _workspace(roots, args.source)
    except LookupError:
        manager, source = await _snapshot(roots, args.source)
    forks = await manager.fork(source, args.count, args.ids)
    return _show(args, {"forks": [{"id": f.id, "path": str(f.host_path)} for f in forks], "mode": manager.fork_mode})


def _show(args: argparse.Namespace, result: Mapping[str, object]) -> int:
    if args.json:
        print_json(result)
        return 0
    for key, value in result.items():
        if not isinstance(value, list):
            progress(f"{key}: {printable(str(value))}")
            continue
        progress(f"{key}: {len(value)}")
        for row in value:
            print("  " + "  ".join(f"{k}={printable(str(v))}" for k, v in row.items()))
    return 0
