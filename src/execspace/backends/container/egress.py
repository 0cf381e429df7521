"""A container run's way out when its network is a :class:`~execspace.models.NetworkPolicy`.

The container keeps ``network_mode=none``: its network namespace has a loopback and no route. For each such run the
engine (root, on the daemon's host) makes a listening socket on a free port of the container's ``127.0.0.1``
(:func:`~execspace.process.egress.listen_in_netns`, entered through ``/proc/PID/ns/net`` of the container's first
process) and serves the run's :class:`~execspace.process.egress.EgressProxy` on it from the host: the program's
only way out is a connection to that port, judged and audited outside the container. Nothing is mounted into the
container and nothing runs in it but the program.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path
from typing import Any

from ...errors import CapabilityError
from ...models import NetworkApprover, NetworkPolicy
from ...process.egress import RunAudit, listen_in_netns, proxy_env
from .config import CONTAINER_WORKSPACE, daemon_socket_path

__all__ = ["egress_unavailable", "open_egress"]


def egress_unavailable(docker_host: str | None, networked: bool) -> str | None:
    """Why runs of this engine cannot take allow-lists (None: they can)."""
    if networked:
        return "the container is on a daemon network: its programs have a route out that bypasses any proxy"
    if os.geteuid() != 0:
        return "the engine must run as root to make the proxy's listener in the container's network namespace"
    if daemon_socket_path(docker_host) is None:
        return "the daemon is reached over TCP: its containers' namespaces may not be on this host"
    return None


async def open_egress(
    api: Any, cid: str, ws_dir: Path, policy: NetworkPolicy, run_dir: str, approve: NetworkApprover | None
) -> tuple[RunAudit, dict[str, str]]:
    """One run's proxy, serving ``policy`` on a listener in container ``cid`` (the one of the workspace at
    ``ws_dir``): its audit (``close`` it when the run is over: open connections are cut and audited) and the proxy
    variables the program gets. Raises :class:`CapabilityError` when the namespace cannot be entered from here, or
    for injection rules (their CA would have to be installed in a running container: the sandbox backend has them)."""
    if policy.inject:
        raise CapabilityError(
            "credentials injected by the egress proxy (NetworkPolicy.inject)",
            "container",
            "use the sandbox backend, or leave inject out",
        )
    sock = await asyncio.to_thread(_listen_in, api, cid, ws_dir)
    port = sock.getsockname()[1]
    try:
        audit = RunAudit(policy, ws_dir, run_dir, approve)
    except BaseException:
        sock.close()
        raise
    await audit.proxy.serve(sock)  # takes the socket over: closed with the proxy
    return audit, proxy_env(port)


def _listen_in(api: Any, cid: str, ws_dir: Path) -> socket.socket:
    state = api.inspect_container(cid)["State"]
    pid = int(state.get("Pid") or 0)
    if not state.get("Running") or pid <= 0:
        raise _unreachable("the workspace's container is not running")
    try:
        proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _unreachable(f"the container's process {pid} is not visible here ({exc})") from None
    try:
        # the daemon's pid names our container only if its root shows this workspace at /workspace; every later
        # lookup goes through the same /proc entry, so a pid reused meanwhile fails instead of naming another
        inside = os.stat(f"root{CONTAINER_WORKSPACE}", dir_fd=proc)
        host = os.stat(ws_dir)
        if (inside.st_dev, inside.st_ino) != (host.st_dev, host.st_ino):
            raise _unreachable(f"process {pid} is not this workspace's container here")
        netns = os.open("ns/net", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    except OSError as exc:
        raise _unreachable(f"cannot open the network namespace of the container's process {pid} ({exc})") from None
    finally:
        os.close(proc)
    try:
        return listen_in_netns(netns)
    except OSError as exc:
        raise _unreachable(f"cannot listen in the container's network namespace ({exc})") from None
    finally:
        with contextlib.suppress(OSError):
            os.close(netns)


def _unreachable(why: str) -> CapabilityError:
    return CapabilityError(
        f"a network allow-list (NetworkPolicy): {why}",
        "container",
        "run the engine as root on the daemon's host (a local unix socket), or use the sandbox backend",
    )
