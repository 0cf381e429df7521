"""Who owns a container, and removal of the ones whose owner is gone.

Every container we create carries labels naming its owner: the engine, the process
(pid and start time, so a reused pid is not mistaken for the owner), the host, the
boot and the pid namespace. :func:`reap_orphans` removes containers whose owner is
provably dead and never touches one whose owner it cannot judge (another host, another
pid namespace). It runs when an engine opens, and by hand::

    python -m execspace.backends.container.reaper [--docker-host unix:///path/docker.sock]

An engine opened with ``watchdog=True`` also starts :func:`start_watchdog`: a small process
that waits for EOF on a pipe only the engine's process holds. Whatever ends that process
(close, exit, SIGTERM, SIGKILL), the pipe closes and the watchdog removes the engine's
containers at once, instead of at the next open.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ...owner import Owner, current_owner, owner_alive
from ...workspace.slots import is_slot_dir
from .connection import connect

__all__ = [
    "LABEL",
    "Owner",
    "current_owner",
    "owner_alive",
    "owner_labels",
    "reap_orphans",
    "remove_engine_containers",
    "remove_pool_dir",
    "start_watchdog",
]

#: Every container we create carries it; the ownership labels are ``LABEL + ".<field>"``.
LABEL = "io.execspace"


def owner_labels(owner: Owner, engine_id: str) -> dict[str, str]:
    """The labels of a container of ``engine_id`` owned by ``owner``."""
    return {LABEL: "1", f"{LABEL}.engine": engine_id, **owner.fields(LABEL)}


def reap_orphans(client: Any, workspace_root: Path | None = None) -> list[str]:
    """Remove the containers (and unused pool directories under ``workspace_root``) of dead owners.

    Returns the ids removed. Idempotent and safe to run from several processes at once.
    """
    here = current_owner()
    reaped: list[str] = []
    for info in client.api.containers(all=True, filters={"label": f"{LABEL}=1"}):
        labels = info.get("Labels") or {}
        owner = Owner.from_fields(LABEL, labels)  # None: not labelled by this version, so it stays
        if owner is None or owner_alive(owner, here) is not False:
            continue
        with contextlib.suppress(Exception):  # gone meanwhile, or removed by another reaper
            client.api.remove_container(info["Id"], force=True)
            reaped.append(str(info["Id"]))
        remove_pool_dir(labels.get(f"{LABEL}.slot"), workspace_root)
    return reaped


def remove_engine_containers(client: Any, engine_id: str, workspace_root: Path | None) -> None:
    """Remove every container labelled with ``engine_id`` (and its unused pool directory)."""
    for info in client.api.containers(all=True, filters={"label": f"{LABEL}.engine={engine_id}"}):
        with contextlib.suppress(Exception):  # already gone is fine: removal is idempotent
            client.api.remove_container(info["Id"], force=True)
        remove_pool_dir((info.get("Labels") or {}).get(f"{LABEL}.slot"), workspace_root)


def remove_pool_dir(slot: str | None, workspace_root: Path | None) -> None:
    """A pool slot never handed out is an empty directory of ours: remove it, and nothing else."""
    if not slot or workspace_root is None:
        return
    path = Path(slot)
    if path.parent != workspace_root.absolute() or not is_slot_dir(path) or path.is_symlink():
        return
    shutil.rmtree(path, ignore_errors=True)


def start_watchdog(docker_host: str | None, engine_id: str, workspace_root: Path) -> subprocess.Popen[bytes]:
    """Start the watchdog of one engine; closing the returned process's stdin (or dying) sets it off."""
    argv = [sys.executable, "-m", __name__, "--watch-engine", engine_id, "--workspace-root", str(workspace_root)]
    if docker_host:
        argv += ["--docker-host", docker_host]
    # its own session: a Ctrl-C to our process group must not kill it before it has cleaned up
    return subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def _watch(docker_host: str | None, engine_id: str, workspace_root: Path | None) -> None:
    with contextlib.suppress(OSError):
        sys.stdin.buffer.read()  # returns at EOF: the engine closed, or its process is gone
    client = connect(docker_host)
    try:
        remove_engine_containers(client, engine_id, workspace_root)
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Remove execspace containers left by dead processes.")
    parser.add_argument("--docker-host", default=None, help="daemon URL (default $DOCKER_HOST or the default socket)")
    parser.add_argument("--workspace-root", type=Path, default=None, help="also remove unused pool dirs under it")
    parser.add_argument("--watch-engine", default=None, help=argparse.SUPPRESS)  # the watchdog mode
    args = parser.parse_args(argv)
    if args.watch_engine:
        _watch(args.docker_host, args.watch_engine, args.workspace_root)
        return 0
    client = connect(args.docker_host)
    try:
        reaped = reap_orphans(client, args.workspace_root)
    finally:
        client.close()
    sys.stdout.write("".join(f"removed {cid[:12]}\n" for cid in reaped) or "nothing to remove\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
