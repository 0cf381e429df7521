"""``execspace ws``: the workspaces the command line left on this host (under its own roots, :mod:`.roots`) — list,
show, remove, and collect the old ones with the old unnamed snapshots; snapshot, fork and restore them
(:mod:`.wsbranches`)."""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import WorkspaceNotFound
from ..workspace.stored import (
    StoredWorkspace,
    find_stored,
    remove_stored,
    stored_details,
    stored_workspaces,
)
from .console import EXIT_EXECSPACE_ERROR, ago, error, human_size, print_json, printable, progress
from .roots import cli_roots
from .run import host_path
from .wsbranches import (
    VERBS,
    Found,
    add_verbs,
    branch_command,
    find_snapshot,
    old_snapshots,
    remove_snapshots,
    snapshot_line,
    snapshot_row,
)

__all__ = ["add_parser"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "ws",
        help="list, show, remove and clean up the workspaces execspace run and exec-code left on this host",
        description="The workspaces execspace run and exec-code left (kept, named, interrupted and crashed runs) and "
        "their snapshots. Default roots: $TMPDIR/execspace-cli-<uid>/<backend>; other programs' workspaces (in "
        "the library's roots, $TMPDIR/execspace-<uid>/...) only with --root.",
    )
    p.add_argument("--root", action="append", type=host_path, metavar="DIR", help="a workspace root (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="list|show|rm|gc|snapshot|snapshots|fork|restore")
    verbs.add_parser("list", help="every workspace, oldest use first")
    show = verbs.add_parser("show", help="one workspace (or every one with that id): record, size, runs, outputs")
    show.add_argument("targets", nargs="+", metavar="DIR|ID", help="an absolute or ./relative directory, else an id")
    rm = verbs.add_parser("rm", help="remove workspaces by directory or id (every one with that id), or a snapshot")
    rm.add_argument(
        "targets",
        nargs="+",
        metavar="DIR|ID|SNAPSHOT",
        help="an absolute or ./relative directory, else a workspace id, else a snapshot's id or name",
    )
    gc = verbs.add_parser(
        "gc", help="remove the workspaces not used for a while, and the snapshots without a name taken as long ago"
    )
    gc.add_argument("--older-than", type=_duration, default=86400.0, metavar="AGE", help="e.g. 30m, 12h, 7d (1d)")
    gc.add_argument("--dry-run", action="store_true", help="only say what would go")
    add_verbs(verbs)
    p.set_defaults(handler=command)


def _duration(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd]?)", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"expected an age such as 30m, 12h or 7d, got {text!r}")
    return float(match[1]) * _UNITS[match[2] or "s"]


def _row(ws: StoredWorkspace, now: float) -> dict[str, object]:
    return {
        "path": str(ws.path),
        "id": ws.id,
        "created_at": round(ws.created_at, 3),
        "last_used": round(ws.last_used, 3),
        "idle_s": round(now - ws.last_used, 1),
        "problem": ws.problem or None,
    }


async def command(args: argparse.Namespace) -> int:
    roots: list[Path] = args.root or cli_roots()
    if args.verb in VERBS:
        return await branch_command(args, roots)
    now = time.time()
    if args.verb == "list":
        found = sorted((ws for root in roots for ws in stored_workspaces(root)), key=lambda ws: ws.last_used)
        return _show(args, found, [], now, "workspaces")
    if args.verb == "show":
        try:
            targets = [ws for key in args.targets for ws in find_stored(roots, key)]
        except WorkspaceNotFound as exc:  # its message says how to find them: not the generic --workspace hint
            error(str(exc))
            return EXIT_EXECSPACE_ERROR
        return _details(args, targets, now)
    if args.verb == "rm":
        named = await _named(roots, args.targets)
        if named is None:
            return EXIT_EXECSPACE_ERROR
        targets, snaps = named
    else:
        targets = [ws for root in roots for ws in stored_workspaces(root) if now - ws.last_used >= args.older_than]
        snaps = await old_snapshots(roots, args.older_than, now)
        if args.dry_run:
            return _show(args, targets, snaps, now, "would remove")
    for ws in targets:
        await asyncio.to_thread(remove_stored, ws)
    await remove_snapshots(snaps)
    return _show(args, targets, snaps, now, "removed")


async def _named(roots: list[Path], keys: list[str]) -> tuple[list[StoredWorkspace], list[Found]] | None:
    """What ``ws rm`` names: for each key the workspaces it names, else the snapshot of that id or name; None
    (after saying so) when a key names neither, so that nothing is removed."""
    workspaces: list[StoredWorkspace] = []
    snaps: list[Found] = []
    for key in keys:
        try:
            workspaces += find_stored(roots, key)
        except WorkspaceNotFound as exc:  # its message says how to find them: not the generic --workspace hint
            found = await find_snapshot(roots, key)
            if found is None:
                error(f"{exc}; nor is it a snapshot's id or name (`execspace ws snapshots` shows those)")
                return None
            snaps.append(found)
    return workspaces, snaps


def _show(args: argparse.Namespace, found: list[StoredWorkspace], snaps: list[Found], now: float, what: str) -> int:
    key = what.replace(" ", "_")
    if args.json:
        rows: dict[str, object] = {key: [_row(ws, now) for ws in found]}
        if args.verb in ("rm", "gc"):
            rows[f"{key}_snapshots"] = [snapshot_row(snap) for _, snap in snaps]
        print_json(rows)
        return 0
    if found or not snaps:
        progress(f"{what}: {len(found) or 'none'}")
    for ws in found:
        note = f"  ({ws.problem})" if ws.problem else ""
        print(f"{ago(now - ws.last_used):>5} idle  {printable(ws.id or '?'):<40} {printable(str(ws.path))}{note}")
    if snaps:
        progress(f"{what} snapshots: {len(snaps)}")
        print("".join(f"  {snapshot_line(snap, now)}\n" for _, snap in snaps), end="")
    sys.stdout.flush()
    return 0


def _details(args: argparse.Namespace, found: list[StoredWorkspace], now: float) -> int:
    rows = []
    for ws in found:
        d = stored_details(ws)
        rows.append({**_row(ws, now), "disk_bytes": d.disk_bytes, "runs": d.runs, "outputs": list(d.outputs)})
        if not args.json:
            print(f"{printable(ws.id or '?')}\n  path:      {printable(str(ws.path))}")
            created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ws.created_at))
            print(f"  created:   {created}   idle: {ago(now - ws.last_used)}   disk: {human_size(d.disk_bytes)}")
            print(f"  runs:      {d.runs}" + (f"   problem: {ws.problem}" if ws.problem else ""))
            more = f" (and {d.more_outputs} more)" if d.more_outputs else ""
            print(f"  outputs:   {len(d.outputs) + d.more_outputs}{more}")
            for name in d.outputs:
                print(f"    {printable(name)}")
    if args.json:
        print_json({"workspaces": rows})
    sys.stdout.flush()
    return 0
