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
import os
import socket
from pathlib import Path

from ...models import NetworkApprover, NetworkPolicy, RunResult
from ...process.egress import AUDIT_FILE, RunAudit, proxy_env, receive_listener

__all__ = ["AUDIT_FILE", "BRIDGE_PATH", "PROXY_PORT", "EgressChannel", "RunAudit", "proxy_env"]

#: The proxy's port on the sandbox's own loopback.
PROXY_PORT = 3128
#: Where the bridge binary is copied in the sandbox.
BRIDGE_PATH = "/.execspace-egress-bridge"
#: Seconds the bridge has to hand its listener over once bwrap started.
_HANDOVER_TIMEOUT = 30.0


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
        self._closed = False

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
        if self._closed:  # the run was over first (its start failed): close took bwrap's fds back already
            return
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
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        else:  # never started: bwrap's fds are still ours
            os.close(self._bridge_fd)
            self._sandbox.close()
        self._host.close()
        self.audit.close()

    def annotate(self, result: RunResult) -> RunResult:
        return self.audit.annotate(result)
