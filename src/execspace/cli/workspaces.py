"""``execspace ws``: the workspaces left on this host — list, show, remove, and collect the old ones; snapshot,
fork and restore them (:mod:`.wsbranches`)."""

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
    default_roots,
    find_stored,
    remove_stored,
    stored_details,
    stored_workspaces,
)
from .console import EXIT_EXECSPACE_ERROR, error, human_size, print_json, printable, progress
from .run import host_path
from .wsbranches import VERBS, add_verbs, branch_command

__all__ = ["add_parser"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "ws",
        help="list, show, remove and clean up the workspaces on this host",
        description="The workspaces the host backends left (kept runs, session ids, crashed runs). Default roots: "
        "$TMPDIR/execspace-<uid>/{workspaces,sandbox,container}.",
    )
    p.add_argument("--root", action="append", type=host_path, metavar="DIR", help="a workspace root (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="list|show|rm|gc|snapshot|snapshots|fork|restore")
    verbs.add_parser("list", help="every workspace, oldest use first")
    show = verbs.add_parser("show", help="one workspace (or every one with that id): record, size, runs, outputs")
    show.add_argument("targets", nargs="+", metavar="DIR|ID", help="an absolute or ./relative directory, else an id")
    rm = verbs.add_parser("rm", help="remove workspaces by directory or id (every one with that id)")
    rm.add_argument("targets", nargs="+", metavar="DIR|ID", help="an absolute or ./relative directory, else an id")
    gc = verbs.add_parser("gc", help="remove the workspaces not used for a while")
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


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


async def command(args: argparse.Namespace) -> int:
    roots: list[Path] = args.root or default_roots()
    if args.verb in VERBS:
        return await branch_command(args, roots)
    now = time.time()
    if args.verb == "list":
        found = sorted((ws for root in roots for ws in stored_workspaces(root)), key=lambda ws: ws.last_used)
        return _show(args, found, now, "workspaces")
    if args.verb in ("rm", "show"):
        try:
            targets = [ws for key in args.targets for ws in find_stored(roots, key)]
        except WorkspaceNotFound as exc:  # its message says how to find them: not the generic --workspace hint
            error(str(exc))
            return EXIT_EXECSPACE_ERROR
        if args.verb == "show":
            return _details(args, targets, now)
    else:
        targets = [ws for root in roots for ws in stored_workspaces(root) if now - ws.last_used >= args.older_than]
        if args.dry_run:
            return _show(args, targets, now, "would remove")
    for ws in targets:
        await asyncio.to_thread(remove_stored, ws)
    return _show(args, targets, now, "removed")


def _show(args: argparse.Namespace, found: list[StoredWorkspace], now: float, what: str) -> int:
    if args.json:
        print_json({what.replace(" ", "_"): [_row(ws, now) for ws in found]})
        return 0
    if not found:
        progress(f"{what}: none")
        return 0
    progress(f"{what}: {len(found)}")
    for ws in found:
        note = f"  ({ws.problem})" if ws.problem else ""
        print(f"{_age(now - ws.last_used):>5} idle  {printable(ws.id or '?'):<40} {printable(str(ws.path))}{note}")
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
            print(f"  created:   {created}   idle: {_age(now - ws.last_used)}   disk: {human_size(d.disk_bytes)}")
            print(f"  runs:      {d.runs}" + (f"   problem: {ws.problem}" if ws.problem else ""))
            more = f" (and {d.more_outputs} more)" if d.more_outputs else ""
            print(f"  outputs:   {len(d.outputs) + d.more_outputs}{more}")
            for name in d.outputs:
                print(f"    {printable(name)}")
    if args.json:
        print_json({"workspaces": rows})
    sys.stdout.flush()
    return 0
