"""Snapshots and forks of e2b workspaces, where the service keeps files-only snapshots as ``execspace serve``
does (detected: its ``GET /snapshots`` answer says how it forks; probed once per engine).

A workspace has a sandbox of its own (unless ``sandbox_id`` shares one), so its snapshot is its sandbox's:
``POST /sandboxes/{id}/snapshots`` with ``memory: false`` (files only; processes are never snapshotted). A fork
is a new sandbox created from a snapshot with the fork's own metadata; its workspace directory keeps the
source's name, which the metadata ``execspace.directory`` records (renaming a directory of an overlay's lower
layer would copy it whole), and is renamed to the fork's key only for a snapshot taken by another engine, whose
directory is not known beforehand. A fork of a live workspace goes through a snapshot taken for it and
deleted after. (E2B's own ``POST /sandboxes/{id}/fork`` copies the source's metadata, which names the workspace
a session sandbox is found again by: a fork made that way would be found as its parent.) A restore replaces
the workspace's sandbox by one created from the snapshot; the old one, with its programs, is killed.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import secrets
import shlex
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from ...errors import BackendError, CapabilityError, InvalidSpec, SetupFailed, SnapshotNotFound
from ...models import Persistence, Snapshot, Workspace, WorkspacePolicy
from ...tracing import NO_TRACER, Tracer
from .sandboxes import Box, Sandboxes, sdk_call, workspace_key

if TYPE_CHECKING:
    from e2b import SnapshotInfo
    from e2b.connection_config import ApiParams

__all__ = ["FORK_HEADER", "E2BBranches"]

T = TypeVar("T")

#: The header ``execspace serve`` puts on its ``GET /snapshots`` answers: how it forks (``cow`` or ``copy``).
FORK_HEADER = "x-execspace-fork"
#: Most forks one call makes (as the host managers and ``execspace serve`` allow).
_MAX_FORKS = 100
_NO_SNAPSHOTS = (
    "Snapshots and forks need a service that keeps files-only snapshots as execspace serve does "
    "(E2B cloud's are of memory too, and not detected as such); serve a host backend with `execspace serve`."
)


class E2BBranches:
    """The snapshots and forks of one engine's e2b workspaces."""

    def __init__(self, boxes: Sandboxes, tracer: Tracer = NO_TRACER) -> None:
        self._boxes = boxes
        self._tracer = tracer
        self._mode: Literal["cow", "copy"] | None = None
        self._probe_lock = asyncio.Lock()
        self._taken: dict[str, Snapshot] = {}  # what this engine snapshotted: the service lists only ids and names

    async def mode(self) -> Literal["cow", "copy"]:
        """How the service forks; probed once.

        Raises:
            CapabilityError: it keeps no files-only snapshots (E2B cloud, and every service but execspace serve).
        """
        async with self._probe_lock:
            if self._mode is None:
                self._mode = await self._probe()
        return self._mode

    async def _probe(self) -> Literal["cow", "copy"]:
        import httpx
        from e2b import ConnectionConfig

        config = ConnectionConfig(**self._boxes.api())
        url = f"{config.api_url}/snapshots"
        try:
            async with httpx.AsyncClient(timeout=self._boxes.options.request_timeout) as client:
                answer = await client.get(url, params={"limit": 1}, headers={"X-API-KEY": config.api_key or ""})
        except httpx.HTTPError as exc:
            raise BackendError(f"asking {url} whether it keeps snapshots: {exc}; is the E2B service up?") from exc
        if answer.status_code == 401:
            raise SetupFailed("e2b", f"{url}: the E2B service refused the API key", "check api_key / E2B_API_KEY")
        mode = answer.headers.get(FORK_HEADER)
        if answer.status_code != 200 or mode not in ("cow", "copy"):
            raise CapabilityError(f"snapshots and forks (the service at {config.api_url})", "e2b", _NO_SNAPSHOTS)
        return "cow" if mode == "cow" else "copy"

    def _own_box(self, ws: Workspace) -> Box:
        box = self._boxes.box(workspace_key(ws.id))
        if not box.owned:
            raise CapabilityError(
                "snapshots and forks of a workspace in a shared sandbox (sandbox_id)",
                "e2b",
                "Leave sandbox_id unset: each workspace then has a sandbox of its own, which a snapshot takes whole.",
            )
        return box

    # -- snapshots -------------------------------------------------------------------

    async def snapshot(self, ws: Workspace, name: str | None) -> Snapshot:
        await self.mode()
        box = self._own_box(ws)
        taking = _invalid_as_spec(box.sandbox.create_snapshot(name, mode="filesystem", **self._traced()))
        info = await box.call("taking a snapshot", taking)
        snap = Snapshot(info.snapshot_id, name, ws.id, None, time.time(), 0, Path(ws.path))
        self._taken[snap.id] = snap
        return snap

    def _traced(self) -> ApiParams:
        """The current span as the ``traceparent`` of one control-plane call (the service's span of it then its
        child). Only calls on a sandbox already made take it: headers given when a sandbox is created or
        connected stay with it for its later calls, and the SDK sends none on its runs and file requests."""
        if not self._tracer.enabled:
            return {}
        return {"api_headers": dict(self._tracer.headers())}

    async def list(self) -> builtins.list[Snapshot]:
        await self.mode()
        return [self._known(info) for info in await self._listed(None)]

    async def _listed(self, name: str | None) -> builtins.list[SnapshotInfo]:
        from e2b_code_interpreter import AsyncSandbox

        pages = AsyncSandbox.list_snapshots(name=name, **self._boxes.api())
        found: builtins.list[SnapshotInfo] = await sdk_call("listing snapshots", pages.next_items())
        while pages.has_next:
            found += await sdk_call("listing snapshots", pages.next_items())
        return found

    def _known(self, info: SnapshotInfo) -> Snapshot:
        taken = self._taken.get(info.snapshot_id)
        if taken is not None:
            return taken
        # taken elsewhere: the service says only its id and names
        name = info.names[0] if info.names else None
        return Snapshot(info.snapshot_id, name, "", None, 0.0, 0, Path())

    async def get(self, key: Snapshot | str) -> Snapshot:
        want = key.id if isinstance(key, Snapshot) else key
        await self.mode()
        for info in await self._listed(want):
            snap = self._known(info)
            if want in (snap.id, snap.name):
                return snap
        raise SnapshotNotFound(f"no snapshot {want!r} on the E2B service: list_snapshots() shows them")

    async def remove(self, key: Snapshot | str) -> None:
        from e2b_code_interpreter import AsyncSandbox

        snap = await self.get(key)
        if not await sdk_call("removing a snapshot", AsyncSandbox.delete_snapshot(snap.id, **self._boxes.api())):
            raise SnapshotNotFound(f"no snapshot {snap.id!r} on the E2B service: it was removed meanwhile")
        self._taken.pop(snap.id, None)

    # -- forks and restores ----------------------------------------------------------

    async def fork(
        self, source: Workspace | Snapshot | str, count: int, ids: Sequence[str] | None, policy: WorkspacePolicy | None
    ) -> builtins.list[Workspace]:
        await self.mode()
        if isinstance(source, Workspace):
            box = self._own_box(source)
            new_ids = await self._fork_ids(source.id, count, ids)
            taking = box.sandbox.create_snapshot(mode="filesystem", **self._traced())
            info = await box.call("snapshotting for a fork", taking)
            try:
                return await self._forks_of(info.snapshot_id, _directory(source.path), new_ids, policy)
            finally:
                await self._forget(info.snapshot_id)
        snap = await self.get(source)
        new_ids = await self._fork_ids(snap.workspace or snap.id, count, ids)
        return await self._forks_of(snap.id, _directory(str(snap.path)), new_ids, policy)

    async def _fork_ids(self, base: str, count: int, ids: Sequence[str] | None) -> builtins.list[str]:
        if ids is not None:
            new_ids = list(ids)
            if len(new_ids) != count and count != 1:
                raise InvalidSpec(f"fork: {len(new_ids)} ids for count={count}; give one id per fork")
        else:
            new_ids = [f"{base}/fork-{secrets.token_hex(4)}" for _ in range(count)]
        if not 1 <= len(new_ids) <= _MAX_FORKS:
            raise InvalidSpec(f"fork: count must be 1..{_MAX_FORKS}, got {len(new_ids)}")
        if len(set(new_ids)) != len(new_ids):
            raise InvalidSpec("fork: the ids must be distinct")
        taken = await self._boxes.keys_in_use()
        for new_id in new_ids:
            if workspace_key(new_id) in taken:
                raise InvalidSpec(f"fork: a workspace with id {new_id!r} exists; remove it or pick another id")
        return new_ids

    async def _forks_of(
        self, snapshot_id: str, directory: str, new_ids: builtins.list[str], policy: WorkspacePolicy | None
    ) -> builtins.list[Workspace]:
        """A sandbox per id from the snapshot (whose workspace directory is ``directory``, "" when unknown): all
        or none."""
        keys = [workspace_key(i) for i in new_ids]
        making = (self._from_snapshot(k, snapshot_id, directory) for k in keys)
        made = await asyncio.gather(*making, return_exceptions=True)
        boxes = [b for b in made if isinstance(b, Box)]
        failed = [e for e in made if isinstance(e, BaseException)]
        if failed:
            for box in boxes:
                with contextlib.suppress(BackendError):  # already gone: nothing of it is left either way
                    await self._boxes.kill(box)
            raise failed[0]
        for key, box in zip(keys, boxes, strict=True):
            self._boxes.hold(key, box)
        pol = policy or WorkspacePolicy(persistence=Persistence.SESSION)
        return [
            Workspace(id=i, path=b.root_of(k), backend="e2b", policy=pol)
            for i, k, b in zip(new_ids, keys, boxes, strict=True)
        ]

    async def _from_snapshot(self, key: str, snapshot_id: str, directory: str) -> Box:
        box = await self._boxes.from_snapshot(key, snapshot_id, directory)
        if directory:
            return box  # its metadata names the directory it keeps
        try:
            await _rename_workspace(box, key)
        except BaseException:
            with contextlib.suppress(BackendError):
                await self._boxes.kill(box)
            raise
        return box

    async def restore(self, ws: Workspace, key: Snapshot | str) -> None:
        await self.mode()
        box = self._own_box(ws)
        snap = await self.get(key)
        fresh = await self._from_snapshot(workspace_key(ws.id), snap.id, _directory(str(snap.path)))
        old = box.sandbox
        await box.release()
        box.renew(fresh)
        # the old sandbox holds the workspace's key too: left running, it could be found again in its place
        await sdk_call(f"killing the sandbox {old.sandbox_id} the restore replaced", old.kill())

    async def _forget(self, snapshot_id: str) -> None:
        from e2b_code_interpreter import AsyncSandbox

        # the forks stand on their own; a snapshot left behind only takes room on the service
        with contextlib.suppress(BackendError):
            await sdk_call("removing a fork's snapshot", AsyncSandbox.delete_snapshot(snapshot_id, **self._boxes.api()))


def _directory(path: str) -> str:
    """The name of a workspace's directory in its sandbox ("" for a snapshot taken elsewhere: not known)."""
    return path.rsplit("/", 1)[-1] if "/.execspace/ws/" in path else ""


async def _rename_workspace(box: Box, key: str) -> None:
    """Move the one workspace directory of a sandbox made from a snapshot taken elsewhere to ``key``'s place
    (on a copy-on-write service this copies it: a directory of a lower layer is renamed by copying it up)."""
    from e2b import CommandExitException

    parent = box.root_of(key).rsplit("/", 1)[0]
    script = (
        f'cd {shlex.quote(parent)} && set -- * && [ $# -eq 1 ] && [ -d "$1" ] || exit 3; '
        f'[ "$1" = {shlex.quote(key)} ] || mv -T -- "$1" {shlex.quote(key)}'
    )
    try:
        await box.call("placing a forked workspace", box.sandbox.commands.run(script))
    except CommandExitException as exc:
        raise BackendError(
            f"the sandbox {box.id} made from a snapshot does not hold one workspace directory under {parent} "
            f"(exit {exc.exit_code}: {exc.stderr.strip()}): was the snapshot taken by execspace's e2b backend?"
        ) from exc


async def _invalid_as_spec(call: Awaitable[T]) -> T:
    """A refused snapshot name is the caller's to fix (``execspace serve`` answers 400 saying why)."""
    from e2b import SandboxException

    try:
        return await call
    except SandboxException as exc:
        if str(exc).startswith("400"):
            raise InvalidSpec(f"snapshot: {exc}") from exc
        raise
