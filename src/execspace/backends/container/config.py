"""The hardened container configuration, and the checks that keep it hardened.

Every relaxation of the defaults is an explicit field; :func:`check_binds` refuses
mounts that would hand the program the container daemon (its socket) or a host tree.
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

__all__ = ["CONTAINER_WORKSPACE", "DEFAULT_USER", "ContainerConfig", "check_binds", "daemon_socket_path"]

#: Where the workspace is mounted inside every container.
CONTAINER_WORKSPACE = "/workspace"

#: ``nobody:nogroup``: a uid that owns nothing in the image.
DEFAULT_USER = (65534, 65534)

_DEFAULT_SOCKET = "/var/run/docker.sock"


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

    def create_kwargs(self, workspace_host: Path, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
        """Keyword arguments for ``containers.create``: the hardened defaults, nothing implicit."""
        volumes = {str(workspace_host): {"bind": CONTAINER_WORKSPACE, "mode": "rw"}}
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
