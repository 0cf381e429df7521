"""The connection to the container daemon (Docker, or Podman's Docker-compatible service)."""

from __future__ import annotations

import os
from typing import Any

from ...errors import SetupFailed
from .config import daemon_socket_path

__all__ = ["connect"]

_DAEMON_FIX = "start dockerd (or `podman system service`) or point DOCKER_HOST / docker_host= at its socket"


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
