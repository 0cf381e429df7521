"""The ``container`` backend: one hardened container per workspace, over the Docker Engine API.

The workspace is a host directory bind-mounted at ``/workspace``; files move in and
out through the host-side confined file code (no symlink is ever followed out of
the workspace), and programs run as ``exec`` in the workspace's long-lived container.
Defaults: no network, read-only root with a tmpfs ``/tmp``, every capability dropped,
``no-new-privileges``, a non-root user, memory/pids/CPU limits, no mount but the workspace.
Works against Docker or Podman's Docker-compatible socket (``docker_host=``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...capabilities import Capabilities, Isolation
from ...engine import BaseEngine
from ...envpolicy import EnvPolicy
from ...errors import SetupFailed
from ...models import Workspace
from ...registry import Probe
from ...workspace.hostfs import HostWorkspaceFS
from ...workspace.hostmanager import HostWorkspaceManager, default_workspace_root
from ...workspace.layout import LAYOUT_DIRS
from .config import CONTAINER_WORKSPACE, DEFAULT_USER, ContainerConfig, daemon_socket_path
from .daemon import WorkspaceContainers, connect
from .runner import ContainerRunner

__all__ = ["CONTAINER_WORKSPACE", "ContainerBackend", "ContainerConfig"]

DOES_NOT_PROTECT = (
    "the container shares the host kernel: a kernel exploit escapes it (use a microVM for hostile code)",
    "memory and pids limits apply to the whole workspace container, not to each run",
    "a run's timeout kills processes carrying its marker or in its process group; one that clears its "
    "environment and starts a new session survives until the workspace is removed",
    "read-only staging only strips write bits; the program owns the files and can restore them",
)


class ContainerBackend:
    name = "container"

    @classmethod
    async def probe(cls, *, docker_host: str | None = None, **options: Any) -> Probe:
        try:
            client = await asyncio.to_thread(connect, docker_host, 3.0)
        except SetupFailed as exc:
            return Probe(False, exc.cause, exc.fix)
        try:
            version = await asyncio.to_thread(client.version)
        finally:
            await asyncio.to_thread(client.close)
        where = docker_host or os.environ.get("DOCKER_HOST") or "default socket"
        product = (version.get("Platform") or {}).get("Name") or "container engine"
        return Probe(True, f"{product} {version.get('Version', '?')} at {where}")

    @classmethod
    def capabilities(cls, config: ContainerConfig, daemon: str = "") -> Capabilities:
        return Capabilities(
            backend="container",
            isolation=Isolation.CONTAINER,
            network_control=True,
            network_default=False,
            clean_env=True,
            read_only_mounts=False,
            streaming=True,
            host_paths=True,
            enforced_limits=frozenset({"timeout", "output_bytes", "memory_bytes", "pids"}),
            languages=(),
            does_not_protect=DOES_NOT_PROTECT,
            details={
                "image": config.image,
                "daemon": daemon,
                "user": f"{config.user[0]}:{config.user[1]}",
                "network": "none",
                "root_fs": f"read-only, tmpfs /tmp ({config.tmp_bytes} bytes)",
                "capabilities": "all dropped, no-new-privileges",
                "memory_bytes": f"{config.memory_bytes} per workspace container (no swap)",
                "pids": f"{config.pids} per workspace container",
                "cpus": f"{config.cpus} (rate limit, not cpu_seconds)",
                "mounts": ", ".join([f"workspace at {CONTAINER_WORKSPACE}", *config.read_only_binds.values()]),
            },
        )

    @classmethod
    async def open(
        cls,
        *,
        image: str,
        docker_host: str | None = None,
        workspace_root: Path | str | None = None,
        env_policy: EnvPolicy | None = None,
        host_roots: Any = (),
        artifacts: Any = None,
        user: tuple[int, int] | None = None,
        memory_bytes: int = 512 * 1024 * 1024,
        pids: int = 256,
        cpus: float = 1.0,
        read_only_binds: Mapping[str, str] | None = None,
    ) -> BaseEngine:
        """Open a container engine.

        Args:
            image: the image every workspace container runs (it needs ``/bin/sh``, ``sleep`` and ``grep``).
            docker_host: daemon URL (``unix:///run/podman/podman.sock``…); default ``$DOCKER_HOST``, else the
                default socket.
            workspace_root: where workspaces are created on this host.
            env_policy: how the run's environment is built (the host's variables never enter).
            user: uid:gid programs run as; default 65534 when we are root, else our own (never 0).
            memory_bytes / pids / cpus: limits of each workspace container.
            read_only_binds: host path → container path mounted read-only (a relaxation; sockets refused).
        """
        config = ContainerConfig(
            image=image,
            user=user or (DEFAULT_USER if os.getuid() == 0 else (os.getuid(), os.getgid())),
            memory_bytes=memory_bytes,
            pids=pids,
            cpus=cpus,
            read_only_binds=dict(read_only_binds or {}),
        )
        client = await asyncio.to_thread(connect, docker_host)
        containers = WorkspaceContainers(client, config, daemon_socket_path(docker_host))
        probe = await cls.probe(docker_host=docker_host)
        caps = cls.capabilities(config, probe.reason)
        owner = _owner(config) if os.getuid() == 0 else _no_owner
        root = Path(workspace_root) if workspace_root else default_workspace_root().with_name("container")
        manager = _ContainerWorkspaceManager(containers, root, prepare=_chown_layout(config.user))
        fs = HostWorkspaceFS(artifacts=artifacts, host_roots=host_roots, owner=owner)
        runner = ContainerRunner(containers, lambda: caps, env_policy or EnvPolicy(), owner)
        return BaseEngine(
            "container", manager, fs, runner, caps, on_close=containers.close, extra={"workspace_root": root}
        )


class _ContainerWorkspaceManager(HostWorkspaceManager):
    def __init__(self, containers: WorkspaceContainers, root: Path, prepare: Callable[[Path], None]) -> None:
        super().__init__("container", root, prepare=prepare, program_path=lambda _p: CONTAINER_WORKSPACE)
        self._containers = containers

    async def cleanup(self, ws: Workspace) -> None:
        await self._containers.remove(ws)  # before the files: nothing keeps writing into a removed tree
        await super().cleanup(ws)


def _owner(config: ContainerConfig) -> Callable[[Workspace], tuple[int, int] | None]:
    def owner(ws: Workspace) -> tuple[int, int] | None:
        return config.user

    return owner


def _no_owner(ws: Workspace) -> tuple[int, int] | None:
    return None


def _chown_layout(user: tuple[int, int]) -> Callable[[Path], None]:
    """As root, hand the layout to the container user so the program can write its workspace."""

    def prepare(ws_dir: Path) -> None:
        if os.getuid() != 0:
            return
        os.lchown(ws_dir, *user)
        for d in LAYOUT_DIRS:
            os.lchown(ws_dir / d, *user)

    return prepare
