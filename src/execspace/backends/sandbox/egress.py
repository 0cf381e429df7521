"""A sandboxed run's way out when its network is a :class:`~execspace.models.NetworkPolicy`.

The sandbox keeps its own empty network namespace (``--unshare-net``) and the network-off seccomp filter. Its only
channel is one end of a socketpair made for this run: the egress bridge (``egressbridge.c``, run first in the
sandbox) listens on ``127.0.0.1:PROXY_PORT`` of the sandbox's loopback, sends that listening socket through the
channel and execs the program. The run's :class:`~execspace.process.egress.EgressProxy` on the host accepts the
program's connections on it: nothing in the sandbox can reach the host but those connections to the proxy, and no
other run or workspace holds the socket. Every attempt is appended to ``network.jsonl`` in the run's directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from dataclasses import replace
from pathlib import Path

from ...models import NetworkApprover, NetworkAttempt, NetworkPolicy, RunResult
from ...process.egress import EgressProxy, audit_line, receive_listener
from ...workspace.confine import ConfinedRoot, split_relpath

__all__ = ["AUDIT_FILE", "BRIDGE_PATH", "PROXY_PORT", "EgressChannel", "RunAudit", "proxy_env"]

#: The proxy's port on the sandbox's own loopback.
PROXY_PORT = 3128
#: Where the bridge binary is copied in the sandbox.
BRIDGE_PATH = "/.execspace-egress-bridge"
#: The audit's file name in the run's directory.
AUDIT_FILE = "network.jsonl"
#: Seconds the bridge has to hand its listener over once bwrap started.
_HANDOVER_TIMEOUT = 30.0


def proxy_env(port: int = PROXY_PORT) -> dict[str, str]:
    """Proxy settings for the program's HTTP clients, pip, npm and git (both cases where tools differ)."""
    http = f"http://127.0.0.1:{port}"
    env = {
        "HTTP_PROXY": http,
        "HTTPS_PROXY": http,
        # socks5h: the proxy resolves names (the sandbox has no DNS)
        "ALL_PROXY": f"socks5h://127.0.0.1:{port}",
        "NO_PROXY": "",
        "PIP_PROXY": http,
        "npm_config_proxy": http,
        "npm_config_https_proxy": http,
        "GIT_CONFIG_COUNT": "2",
        "GIT_CONFIG_KEY_0": "http.proxy",
        "GIT_CONFIG_VALUE_0": http,
        "GIT_CONFIG_KEY_1": "https.proxy",
        "GIT_CONFIG_VALUE_1": http,
    }
    env.update({key.lower(): value for key, value in env.items() if key.endswith("_PROXY")})
    return env


class RunAudit:
    """One run's proxy and its audit: every attempt is appended to ``network.jsonl`` in the run's directory and
    returned in its result (:meth:`annotate`). Serve it on a listener with ``proxy.serve``; :meth:`close` when the
    run is over (its open connections are cut and audited)."""

    def __init__(self, policy: NetworkPolicy, root: Path, run_dir: str, approve: NetworkApprover | None = None) -> None:
        self._audit_fd = _open_audit(root, run_dir)
        self.proxy = EgressProxy(policy, Path(run_dir).name, on_record=self._write, approve=approve)

    def close(self) -> None:
        self.proxy.close()
        os.close(self._audit_fd)

    def annotate(self, result: RunResult) -> RunResult:
        return replace(result, network_audit=self.proxy.audit())

    def _write(self, attempt: NetworkAttempt) -> None:
        with contextlib.suppress(OSError):  # a full disk loses the file's line, not the result's
            os.write(self._audit_fd, audit_line(attempt))


class EgressChannel:
    """One run's channel and proxy: made when the run is wrapped, closed when it is over.

    Args:
        bridge: the built bridge binary (:func:`~.supervisorbin.egress_bridge_binary`).
        root, run_dir: the workspace's host directory and the run's directory in it (the audit goes there).
        approve: the approval flow for destinations the policy does not list.
    """

    def __init__(
        self, policy: NetworkPolicy, bridge: Path, root: Path, run_dir: str, approve: NetworkApprover | None = None
    ) -> None:
        self.audit = RunAudit(policy, root, run_dir, approve)
        self._host, self._sandbox = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._bridge_fd = os.open(bridge, os.O_RDONLY | os.O_CLOEXEC)
        self._task: asyncio.Task[None] | None = None

    @property
    def pass_fds(self) -> tuple[int, ...]:
        """The fds bwrap must inherit: the bridge binary it copies in and the sandbox's end of the channel."""
        return self._bridge_fd, self._sandbox.fileno()

    def bwrap_args(self) -> list[str]:
        return ["--perms", "0755", "--ro-bind-data", str(self._bridge_fd), BRIDGE_PATH]

    def argv(self, inner: list[str]) -> list[str]:
        return [BRIDGE_PATH, str(self._sandbox.fileno()), str(PROXY_PORT), "--", *inner]

    def started(self) -> None:
        """bwrap is started (or failed to): close what only it needed and wait for the bridge's listener."""
        os.close(self._bridge_fd)
        self._sandbox.close()
        self._task = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        try:
            async with asyncio.timeout(_HANDOVER_TIMEOUT):
                listener = await receive_listener(self._host)
        except (OSError, TimeoutError):
            # only a bridge that failed sends nothing, and then it exits 126 saying why: the program never ran
            return
        finally:
            self._host.close()
        await self.audit.proxy.serve(listener)

    def close(self) -> None:
        """The run is over: stop the proxy (its open connections are cut and audited) and close the audit."""
        if self._task is not None:
            self._task.cancel()
        else:  # never started: bwrap's fds are still ours
            os.close(self._bridge_fd)
            self._sandbox.close()
        self._host.close()
        self.audit.close()

    def annotate(self, result: RunResult) -> RunResult:
        return self.audit.annotate(result)


def _open_audit(root: Path, run_dir: str) -> int:
    # through fds pinned from the root: the program may have replaced the run directory by a symlink by now
    with ConfinedRoot(str(root)) as cr:
        dir_fd = cr.open_dir(split_relpath(run_dir))
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(AUDIT_FILE, flags, 0o644, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
