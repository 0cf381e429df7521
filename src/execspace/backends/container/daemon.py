"""The daemon connection and the one long-lived container behind each workspace."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from pathlib import Path
from typing import Any

from ...errors import SetupFailed
from ...models import Workspace
from ...workspace.layout import sanitize_id
from .config import ContainerConfig, check_binds, daemon_socket_path

__all__ = ["LABEL", "WorkspaceContainers", "connect"]

#: Every container we create carries it, with the engine and process that own it (for a reaper).
LABEL = "io.execspace"


def connect(docker_host: str | None, timeout: float = 10.0) -> Any:
    """A Docker SDK client for ``docker_host`` (or ``$DOCKER_HOST`` / the default socket); raises ``SetupFailed``."""
    try:
        import docker  # type: ignore[import-untyped]  # the SDK ships no type information
    except ImportError as exc:
        raise SetupFailed(
            "container", f"the docker SDK is not installed ({exc})", "pip install 'execspace[docker]'"
        ) from exc
    sock = daemon_socket_path(docker_host)
    if sock is not None and not os.path.exists(sock):
        # checked here: the SDK leaks the socket of a failed unix connect
        raise SetupFailed("container", f"no container daemon socket at {sock}", _DAEMON_FIX)
    client = None
    try:
        if docker_host:
            client = docker.DockerClient(base_url=docker_host, timeout=timeout)
        else:
            client = docker.from_env(timeout=timeout)
        client.ping()
    except Exception as exc:  # the SDK raises DockerException, requests and OS errors alike
        if client is not None:
            client.close()
        where = docker_host or os.environ.get("DOCKER_HOST") or "the default socket"
        raise SetupFailed(
            "container",
            f"no container daemon answers at {where} ({exc})",
            _DAEMON_FIX,
        ) from exc
    return client


class WorkspaceContainers:
    """Creates a workspace's container on first use and removes it with the workspace or engine."""

    def __init__(self, client: Any, config: ContainerConfig, daemon_socket: str | None) -> None:
        self.client = client
        self.config = config
        self._daemon_socket = daemon_socket
        self._engine_id = secrets.token_hex(6)
        self._ids: dict[Path, str] = {}
        self._locks: dict[Path, asyncio.Lock] = {}

    async def ensure(self, ws: Workspace) -> str:
        """The id of the running container for ``ws``, creating it if needed."""
        assert ws.host_path is not None
        key = ws.host_path
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            cid = self._ids.get(key)
            if cid is None:
                cid = await asyncio.to_thread(self._create, ws)
                self._ids[key] = cid
            return cid

    def forget(self, ws: Workspace) -> None:
        """Drop a container that stopped answering, so the next run creates a fresh one."""
        if ws.host_path is not None:
            self._ids.pop(ws.host_path, None)

    def _create(self, ws: Workspace) -> str:
        assert ws.host_path is not None
        check_binds([ws.host_path, *(Path(p) for p in self.config.read_only_binds)], self._daemon_socket)
        name = f"execspace-{sanitize_id(ws.id)[:40]}-{secrets.token_hex(4)}"
        labels = {LABEL: "1", f"{LABEL}.engine": self._engine_id, f"{LABEL}.pid": str(os.getpid())}
        kwargs = self.config.create_kwargs(ws.host_path, name, labels)
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
        return str(container.id)

    async def remove(self, ws: Workspace) -> None:
        if ws.host_path is None:
            return
        cid = self._ids.pop(ws.host_path, None)
        if cid is not None:
            await asyncio.to_thread(self._remove_id, cid)

    async def close(self) -> None:
        ids, self._ids = list(self._ids.values()), {}
        await asyncio.gather(*(asyncio.to_thread(self._remove_id, cid) for cid in ids))
        await asyncio.to_thread(self.client.close)

    def _remove_id(self, cid: str) -> None:
        with contextlib.suppress(Exception):  # already gone is fine: removal is idempotent
            self.client.api.remove_container(cid, force=True)


def _remove(container: Any) -> None:
    with contextlib.suppress(Exception):
        container.remove(force=True)


_DAEMON_FIX = "start dockerd (or `podman system service`) or point DOCKER_HOST / docker_host= at its socket"
_IMAGE_FIX = "check the image exists locally (no registry is needed; see docs/backends.md for an offline recipe)"
