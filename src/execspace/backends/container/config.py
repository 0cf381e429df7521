"""The hardened container configuration, and the checks that keep it hardened.

Every relaxation of the defaults is an explicit field; :func:`check_binds` refuses
mounts that would hand the program the container daemon (its socket) or a host tree.
The workspace is mounted as the sandbox backend mounts it (:func:`workspace_mounts`): its root
read-only, the layout directories writable, protected paths below them read-only, so that a
program cannot plant a ``.git/config`` or an ``.envrc`` that the host runs later.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ...errors import PolicyViolation
from ...workspace.layout import LAYOUT_DIRS
from ...workspace.protected import DEFAULT_PROTECTED, INTERNAL_DIR, PlaceholderRun

__all__ = [
    "CONTAINER_WORKSPACE",
    "DEFAULT_USER",
    "ContainerConfig",
    "check_binds",
    "daemon_socket_path",
    "workspace_mounts",
]

#: Where the workspace is mounted inside every container.
CONTAINER_WORKSPACE = "/workspace"

#: ``nobody:nogroup``: a uid that owns nothing in the image.
DEFAULT_USER = (65534, 65534)

_DEFAULT_SOCKET = "/var/run/docker.sock"

#: Top-level layout directories the program writes; the rest of the workspace root is read-only to it.
_WRITABLE_TOP = tuple(dict.fromkeys(d.split("/")[0] for d in LAYOUT_DIRS))


@dataclass(frozen=True, slots=True)
class ContainerConfig:
    """What each workspace container is created with."""

    image: str
    user: tuple[int, int] = DEFAULT_USER
    memory_bytes: int = 512 * 1024 * 1024
    pids: int = 256
    cpus: float = 1.0
    tmp_bytes: int = 64 * 1024 * 1024
    read_only_binds: Mapping[str, str] = field(default_factory=dict)
    """Extra host paths mounted read-only (host path → container path): a relaxation, off by default."""
    labels: Mapping[str, str] = field(default_factory=dict)
    network: str = "none"
    """``"none"``, or the name of a daemon network to attach to (a relaxation: the program reaches the network)."""
    nofile: int = 1024
    """Open-files rlimit (soft = hard), explicit: Podman's default exceeds the hard limit of some hosts."""
    nproc: int = 4096
    """Processes rlimit of the container user (counted per uid by the kernel, so only a backstop to ``pids``)."""
    protected: tuple[str, ...] = DEFAULT_PROTECTED
    """Workspace-relative paths the program never writes (:mod:`execspace.workspace.protected`)."""

    def __post_init__(self) -> None:
        if self.network in ("host", "") or self.network.startswith(("container:", "ns:")):
            raise PolicyViolation(
                f"container network {self.network!r} is refused: it shares another namespace; "
                "use 'none' or the name of a daemon network"
            )
        if self.user[0] == 0:
            raise PolicyViolation("container user uid 0 is refused: programs run as a non-root user")
        for name in ("memory_bytes", "pids", "tmp_bytes", "nofile", "nproc"):
            if getattr(self, name) <= 0:
                raise PolicyViolation(f"container {name} must be positive")
        if self.cpus <= 0:
            raise PolicyViolation("container cpus must be positive")

    def create_kwargs(
        self, workspace_host: Path, name: str, labels: Mapping[str, str], held: PlaceholderRun
    ) -> dict[str, Any]:
        """Keyword arguments for ``containers.create``: the hardened defaults, nothing implicit.

        Side effects and errors: those of :func:`workspace_mounts` (the layout must exist).
        """
        volumes = workspace_mounts(workspace_host, self.protected, held)
        volumes.update({src: {"bind": dest, "mode": "ro"} for src, dest in self.read_only_binds.items()})
        return {
            "image": self.image,
            # a do-nothing PID 1 keeps the container up; init=True puts a reaper above it so
            # orphans of killed runs do not pile up as zombies
            "command": ["sleep", "infinity"],
            "init": True,
            "name": name,
            "labels": {**self.labels, **labels},
            "detach": True,
            "user": f"{self.user[0]}:{self.user[1]}",
            "working_dir": CONTAINER_WORKSPACE,
            "environment": {},
            "network_mode": self.network,
            "read_only": True,
            "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={self.tmp_bytes},mode=1777"},
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges:true"],
            "privileged": False,
            "mem_limit": self.memory_bytes,
            "memswap_limit": self.memory_bytes,  # no swap on top: the memory cap is the cap
            "pids_limit": self.pids,
            "nano_cpus": int(self.cpus * 1e9),
            "volumes": volumes,
            "ipc_mode": "private",
            "ulimits": [
                {"name": "nofile", "soft": self.nofile, "hard": self.nofile},
                {"name": "nproc", "soft": self.nproc, "hard": self.nproc},
            ],
        }

    @property
    def networked(self) -> bool:
        return self.network != "none"


def workspace_mounts(
    workspace_host: Path, protected: tuple[str, ...], held: PlaceholderRun
) -> dict[str, dict[str, str]]:
    """The workspace's bind mounts: the root read-only (so that no protected path can be created or changed
    there), each writable layout directory over it, and each protected path below one of them read-only, a
    missing one (or its first missing parent) a transient placeholder held in ``held`` for the container's
    life; writable directories on the way to one are mount points of their own, so that the program cannot
    rename it away (a mount point cannot be renamed). Docker mounts shallow paths first.

    Raises:
        PathDenied: a layout directory or a protected path is a symlink or lies under one.
    """
    root = str(workspace_host)

    def vol(rel: str, mode: str) -> tuple[str, dict[str, str]]:
        return f"{root}/{rel}", {"bind": f"{CONTAINER_WORKSPACE}/{rel}", "mode": mode}

    names = tuple(dict.fromkeys((*protected, INTERNAL_DIR)))
    volumes = {root: {"bind": CONTAINER_WORKSPACE, "mode": "ro"}}
    volumes.update(vol(d, "ro" if d in names else "rw") for d in _WRITABLE_TOP)
    for rel in names:
        parts = [c for c in rel.split("/") if c not in ("", ".")]
        if len(parts) < 2 or parts[0] not in _WRITABLE_TOP:
            continue  # at the read-only root, or a layout directory mounted read-only above
        mount = held.mount_point(root, "/".join(parts)).split("/")  # docker would follow a symlink: refused
        volumes.update(vol("/".join(mount[:n]), "rw") for n in range(2, len(mount)))
        volumes.update([vol("/".join(mount), "ro")])
    return volumes


def daemon_socket_path(base_url: str | None) -> str | None:
    """The host path of the daemon's unix socket (``None`` for a TCP daemon)."""
    url = base_url or os.environ.get("DOCKER_HOST") or f"unix://{_DEFAULT_SOCKET}"
    parsed = urlparse(url)
    if parsed.scheme in ("unix", "http+unix"):
        return parsed.path
    return None


def check_binds(sources: list[Path], daemon_socket: str | None) -> None:
    """Refuse a bind that is, or contains, a daemon socket: it would give the program root on the host."""
    sockets = {os.path.realpath(p) for p in (daemon_socket, _DEFAULT_SOCKET, "/run/podman/podman.sock") if p}
    for src in sources:
        real = os.path.realpath(src)
        try:
            if stat.S_ISSOCK(os.stat(real).st_mode):
                raise PolicyViolation(f"{src}: mounting a socket into a container is refused")
        except FileNotFoundError:
            continue
        for sock in sockets:
            if sock == real or sock.startswith(real.rstrip("/") + "/"):
                raise PolicyViolation(f"{src}: the container daemon socket {sock} would be reachable inside")
