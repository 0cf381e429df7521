"""The daemon connection and the one long-lived container behind each workspace."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import os
import secrets
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import BackendError, SetupFailed
from ...languages import LANGUAGES
from ...models import Workspace
from ...workspace.layout import sanitize_id
from ...workspace.protected import PlaceholderRun, Placeholders
from ...workspace.slots import is_slot_dir, laid_out_slot
from .config import ContainerConfig, check_binds
from .connection import connect
from .memory import member_kwargs
from .pool import PoolSlot
from .reaper import LABEL, current_owner, owner_labels, remove_engine_containers

__all__ = ["LABEL", "DaemonInfo", "WorkspaceContainers", "connect", "daemon_info"]


@dataclass(frozen=True, slots=True)
class DaemonInfo:
    """Which container engine answers, for ``execspace doctor`` and ``Capabilities.details``."""

    product: str
    """``Docker`` or ``Podman`` (or the daemon's own platform name)."""
    version: str
    api_version: str
    where: str

    def __str__(self) -> str:
        return f"{self.product} {self.version} (API {self.api_version}) at {self.where}"


def daemon_info(client: Any, docker_host: str | None = None) -> DaemonInfo:
    """Ask the daemon what it is: Podman names itself in ``Components``, Docker in ``Platform``."""
    version = client.version()
    names = [str(c.get("Name", "")) for c in version.get("Components") or []]
    platform = str((version.get("Platform") or {}).get("Name") or "")
    if any("podman" in n.lower() for n in names):
        product = "Podman"
    elif "docker" in platform.lower() or any(n.lower() == "engine" for n in names):
        product = "Docker"
    else:
        product = platform or "container engine"
    where = docker_host or os.environ.get("DOCKER_HOST") or "the default socket"
    return DaemonInfo(product, str(version.get("Version", "?")), str(version.get("ApiVersion", "?")), where)


#: Image label listing the languages whose runtimes the image has (comma-separated names from
#: :data:`execspace.languages.LANGUAGES`); ``execspace image build`` sets it.
LANGUAGES_LABEL = "execspace.languages"


def image_languages(client: Any, image: str) -> tuple[str, ...]:
    """The languages ``image`` declares in its :data:`LANGUAGES_LABEL` label (none if it has no such label).

    Raises SetupFailed when the daemon has no such image: better at open than at the first run.
    """
    import docker.errors  # type: ignore[import-untyped]

    try:
        labels = client.images.get(image).labels or {}
    except docker.errors.ImageNotFound:
        raise SetupFailed(
            "container",
            f"the daemon has no image {image!r}",
            f"build it with `execspace image build --name {image}`, or pull it (docker pull {image})",
        ) from None
    known = {lang.name for lang in LANGUAGES}
    declared = [name.strip() for name in str(labels.get(LANGUAGES_LABEL, "")).split(",")]
    return tuple(name for name in declared if name in known)


class WorkspaceContainers:
    """The containers of one engine: created on first use or adopted from the pool, removed with the
    workspace, at engine close, and at interpreter exit (a crash is left to :func:`reap_orphans`).

    Each workspace has its container (:meth:`ensure`) and, for the runs that ask for ``memory_bytes``, a member per
    distinct limit (:meth:`member`, see :mod:`.memory`)."""

    def __init__(self, client: Any, config: ContainerConfig, daemon_socket: str | None) -> None:
        self.client = client
        self.config = config
        self._daemon_socket = daemon_socket
        self.engine_id = secrets.token_hex(6)
        self._labels = owner_labels(current_owner(), self.engine_id)
        self._ids: dict[Path, str] = {}
        self._members: dict[Path, dict[int, str]] = {}
        """Each workspace's member containers, by their memory limit."""
        self._oom_seen: dict[str, int] = {}
        """The OOM kills last counted in each container's cgroup (0 when it was created)."""
        self._locks: dict[Path, asyncio.Lock] = {}
        # each container's transient placeholders (its bind mounts), released once it is removed
        self._placeholders = Placeholders()
        self._held: dict[str, PlaceholderRun] = {}
        self.pool_root: Path | None = None
        """Where this engine's pool slot directories live (set when it has a pool)."""
        atexit.register(self.remove_all_now)

    async def ensure(self, ws: Workspace) -> str:
        """The id of the running container for ``ws``, creating it if needed."""
        assert ws.host_path is not None
        key = ws.host_path
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            cid = self._ids.get(key)
            if cid is None:
                cid = await asyncio.to_thread(self._create, ws.id, ws.host_path)
                self._ids[key] = cid
            return cid

    async def member(self, ws: Workspace, memory_bytes: int) -> str:
        """The id of the running member container of ``ws`` for ``memory_bytes``, creating it (and the
        workspace's container, whose namespaces it joins) if needed."""
        owner = await self.ensure(ws)
        assert ws.host_path is not None
        key = ws.host_path
        async with self._locks[key]:
            members = self._members.setdefault(key, {})
            cid = members.get(memory_bytes)
            if cid is None:
                joined = functools.partial(member_kwargs, owner=owner, memory_bytes=memory_bytes)
                cid = await asyncio.to_thread(self._create, ws.id, key, shape=joined)
                members[memory_bytes] = cid
            return cid

    def adopt(self, ws_dir: Path, slot: PoolSlot) -> None:
        """Make a pool container the one of the workspace now at ``ws_dir`` (its slot dir, renamed)."""
        self._ids[ws_dir] = slot.container_id

    async def forget(self, cid: str) -> None:
        """Drop ``cid``, a container that stopped answering, so the next run creates a fresh one; a workspace's
        container takes its members with it (they joined its namespaces)."""
        gone = [cid]
        for key in [key for key, own in self._ids.items() if own == cid]:
            del self._ids[key]
            gone.extend(self._members.pop(key, {}).values())
        for key, members in self._members.items():
            self._members[key] = {limit: m for limit, m in members.items() if m != cid}
        await asyncio.gather(*(asyncio.to_thread(self._remove_id, c) for c in gone))

    def state(self, cid: str) -> dict[str, Any]:
        """The daemon's ``State`` of ``cid`` (empty when it has none: the container is gone)."""
        try:
            return dict(self.client.api.inspect_container(cid)["State"])
        except Exception:
            return {}

    def oom_seen(self, cid: str) -> int | None:
        """The OOM kills last counted in ``cid``'s cgroup (None: not a container of ours)."""
        return self._oom_seen.get(cid)

    def saw_ooms(self, cid: str, count: int) -> None:
        if cid in self._oom_seen:
            self._oom_seen[cid] = max(self._oom_seen[cid], count)

    def workspace_ids(self, ws: Workspace) -> list[str]:
        """The containers of ``ws``: its own, then its members."""
        if ws.host_path is None:
            return []
        own = self._ids.get(ws.host_path)
        return [*([own] if own else []), *self._members.get(ws.host_path, {}).values()]

    def make_slot(self) -> PoolSlot:
        """A started container bound to a fresh, empty directory under ``pool_root`` (for the warm pool)."""
        assert self.pool_root is not None
        with laid_out_slot(self.pool_root) as slot_dir:  # its layout directories are bind mounts of the container
            if os.getuid() == 0:
                os.lchown(slot_dir, *self.config.user)
            cid = self._create("pool", slot_dir, {f"{LABEL}.slot": str(slot_dir)})
        return PoolSlot(cid, slot_dir)

    def discard_slot(self, slot: PoolSlot) -> None:
        self._remove_id(slot.container_id)
        if is_slot_dir(slot.host_dir):  # never a directory that became a workspace
            shutil.rmtree(slot.host_dir, ignore_errors=True)

    def _create(
        self,
        name_hint: str,
        host_dir: Path,
        extra_labels: dict[str, str] | None = None,
        shape: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> str:
        """Create and start a container of ``host_dir`` (``shape`` turns the hardened arguments into a member's)."""
        check_binds([host_dir, *(Path(p) for p in self.config.read_only_binds)], self._daemon_socket)
        name = f"execspace-{sanitize_id(name_hint)[:40]}-{secrets.token_hex(4)}"
        held = self._placeholders.run()
        try:
            kwargs = self.config.create_kwargs(host_dir, name, {**self._labels, **(extra_labels or {})}, held)
            if shape is not None:
                kwargs = shape(kwargs)
            image = kwargs.pop("image")
            try:
                container = self.client.containers.create(image, **kwargs)
            except Exception as exc:
                raise SetupFailed("container", f"cannot create a container from {image!r} ({exc})", _IMAGE_FIX) from exc
            try:
                container.start()
            except Exception as exc:
                _remove(container)
                raise SetupFailed("container", f"container from {image!r} does not start ({exc})", _IMAGE_FIX) from exc
        except BaseException:
            held.release()
            raise
        self._held[str(container.id)] = held
        self._oom_seen[str(container.id)] = 0  # a new cgroup has killed nothing
        return str(container.id)

    @contextlib.asynccontextmanager
    async def paused(self, ws: Workspace) -> AsyncIterator[None]:
        """The workspace's containers paused (their cgroups frozen) for the block, so that a snapshot copies a state
        none of its programs changes meanwhile; unpaused afterwards, also when the body raises."""
        async with contextlib.AsyncExitStack() as stack:
            for cid in self.workspace_ids(ws):
                await stack.enter_async_context(self._paused(cid))
            yield

    @contextlib.asynccontextmanager
    async def _paused(self, cid: str) -> AsyncIterator[None]:
        if not await asyncio.to_thread(self._pause, cid):
            yield  # it does not run: nothing in it writes
            return
        try:
            yield
        finally:
            await asyncio.to_thread(self.client.api.unpause, cid)

    def _pause(self, cid: str) -> bool:
        """Pause ``cid``; False when it is not running (gone, or exited: its programs with it)."""
        from docker.errors import APIError, NotFound

        try:
            self.client.api.pause(cid)
        except NotFound:
            return False
        except APIError as exc:
            if exc.status_code == 409 and not self.client.api.inspect_container(cid)["State"]["Running"]:
                return False
            raise BackendError(
                f"cannot pause container {cid[:12]} for a snapshot ({exc}); is the daemon healthy? retry"
            ) from exc
        return True

    async def remove(self, ws: Workspace) -> None:
        if ws.host_path is None:
            return
        own = self._ids.pop(ws.host_path, None)
        members = self._members.pop(ws.host_path, {}).values()
        # the members first: they live in the namespaces of the workspace's container
        await asyncio.gather(*(asyncio.to_thread(self._remove_id, cid) for cid in members))
        if own is not None:
            await asyncio.to_thread(self._remove_id, own)

    async def close(self) -> None:
        ids = [cid for members in self._members.values() for cid in members.values()]
        await asyncio.gather(*(asyncio.to_thread(self._remove_id, cid) for cid in ids))
        ids, self._ids, self._members = list(self._ids.values()), {}, {}
        await asyncio.gather(*(asyncio.to_thread(self._remove_id, cid) for cid in ids))
        await asyncio.to_thread(self.remove_all_now)
        atexit.unregister(self.remove_all_now)
        await asyncio.to_thread(self.client.close)

    def remove_all_now(self) -> None:
        """Remove every container of this engine, found by its label (also ones whose creation raced a close)."""
        try:
            remove_engine_containers(self.client, self.engine_id, self.pool_root)
            filters = {"label": f"{LABEL}.engine={self.engine_id}"}
            left = {c["Id"] for c in self.client.api.containers(all=True, filters=filters)}
        except Exception:  # at exit the daemon may be gone: best effort (placeholders it may still mount stay)
            return
        for cid in [c for c in self._held if c not in left]:
            self._held.pop(cid).release()

    def _remove_id(self, cid: str) -> None:
        try:
            self.client.api.remove_container(cid, force=True)
        except Exception:  # already gone, or the daemon failed: remove_all_now checks again at close
            return
        self._oom_seen.pop(cid, None)
        if (held := self._held.pop(cid, None)) is not None:
            held.release()  # nothing mounts its placeholders any more


def _remove(container: Any) -> None:
    with contextlib.suppress(Exception):
        container.remove(force=True)


_IMAGE_FIX = "check the image exists on the daemon (docker images); `execspace image build` makes one with no registry"
