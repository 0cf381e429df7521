"""A sandboxed run's way out when its network is a :class:`~execspace.models.NetworkPolicy`.

The sandbox keeps its own empty network namespace (``--unshare-net``) and the network-off seccomp filter. Its only
channel is one end of a socketpair made for this run: the egress bridge (``egressbridge.c``, run first in the
sandbox) listens on ``127.0.0.1:PROXY_PORT`` of the sandbox's loopback, sends that listening socket through the
channel and execs the program. The run's :class:`~execspace.process.egress.EgressProxy` on the host accepts the
program's connections on it: nothing in the sandbox can reach the host but those connections to the proxy, and no
other run or workspace holds the socket. Every attempt is appended to ``network.jsonl`` in the run's directory.

A policy with injection rules gets a CA of the run's own (:mod:`~execspace.process.egressca`): its certificate, in
a bundle with the system's roots, is copied into the sandbox at :data:`CA_BUNDLE_PATH` (and over the system's trust
store files the view shows), and the usual variables point clients at it; its key stays in the proxy.
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from collections.abc import Mapping
from pathlib import Path

from ...models import NetworkApprover, NetworkPolicy, RunResult
from ...process.egress import AUDIT_FILE, RunAudit, proxy_env, receive_listener, without_secrets
from ...process.egressinject import Injections, make_ca
from .bwrap import data_fd

__all__ = [
    "AUDIT_FILE",
    "BRIDGE_PATH",
    "CA_BUNDLE_PATH",
    "PROXY_PORT",
    "EgressChannel",
    "RunAudit",
    "proxy_env",
    "trust_env",
    "without_secrets",
]

#: The proxy's port on the sandbox's own loopback.
PROXY_PORT = 3128
#: Where the bridge binary is copied in the sandbox.
BRIDGE_PATH = "/.execspace-egress-bridge"
#: Where a run whose proxy injects credentials finds the roots it trusts: the system's and the run's CA.
CA_BUNDLE_PATH = "/.execspace-egress-ca.pem"
#: Seconds the bridge has to hand its listener over once bwrap started.
_HANDOVER_TIMEOUT = 30.0


class EgressChannel:
    """One run's channel and proxy: made when the run is wrapped, closed when it is over.

    Args:
        bridge: the built bridge binary (:func:`~.supervisorbin.egress_bridge_binary`).
        root, run_dir: the workspace's host directory and the run's directory in it (the audit goes there).
        approve: the approval flow for destinations the policy does not list.
        system_root: where the sandbox's system files come from (None: the host's ``/``); ``overlay_trust``: copy
            the CA bundle over the trust store files found there (not where the view is layered: machine mode).
    """

    def __init__(
        self,
        policy: NetworkPolicy,
        bridge: Path,
        root: Path,
        run_dir: str,
        approve: NetworkApprover | None = None,
        *,
        system_root: str | None = None,
        overlay_trust: bool = True,
    ) -> None:
        ca = make_ca(Injections(policy.inject).hosts, "sandbox") if policy.inject else None
        #: (fd, path in the sandbox) of the trust files bwrap copies in
        self._trust: list[tuple[int, str]] = []
        if ca is not None:
            self._trust = _trust_files(ca.cert_pem, system_root, overlay_trust)
        try:
            self.audit = RunAudit(policy, root, run_dir, approve, ca)
        except BaseException:
            self._close_trust()
            raise
        self._host, self._sandbox = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._bridge_fd = os.open(bridge, os.O_RDONLY | os.O_CLOEXEC)
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def pass_fds(self) -> tuple[int, ...]:
        """The fds bwrap must inherit: the bridge binary it copies in, the sandbox's end of the channel, the trust
        files."""
        return self._bridge_fd, self._sandbox.fileno(), *(fd for fd, _ in self._trust)

    def bwrap_args(self) -> list[str]:
        trust = [arg for fd, path in self._trust for arg in ("--perms", "0444", "--ro-bind-data", str(fd), path)]
        return ["--perms", "0755", "--ro-bind-data", str(self._bridge_fd), BRIDGE_PATH, *trust]

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The program's environment ``env`` with the proxy's variables (and the trust bundle's, when the proxy
        injects), less any variable that holds an injected value."""
        added = {**proxy_env(PROXY_PORT), **(trust_env(CA_BUNDLE_PATH) if self._trust else {})}
        return without_secrets({**env, **added}, self.audit.proxy.rules.policy)

    def argv(self, inner: list[str]) -> list[str]:
        return [BRIDGE_PATH, str(self._sandbox.fileno()), str(PROXY_PORT), "--", *inner]

    def started(self) -> None:
        """bwrap is started (or failed to): close what only it needed and wait for the bridge's listener."""
        if self._closed:  # the run was over first (its start failed): close took bwrap's fds back already
            return
        os.close(self._bridge_fd)
        self._sandbox.close()
        self._close_trust()
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
            self._close_trust()
        self._host.close()
        self.audit.close()

    def annotate(self, result: RunResult) -> RunResult:
        return self.audit.annotate(result)

    def _close_trust(self) -> None:
        for fd, _ in self._trust:
            os.close(fd)
        self._trust.clear()


def trust_env(bundle: str) -> dict[str, str]:
    """Variables that point a program's TLS clients at ``bundle`` (OpenSSL, Python's ssl and requests, curl, git,
    Node.js, which adds it to its own roots)."""
    return {
        "SSL_CERT_FILE": bundle,
        "REQUESTS_CA_BUNDLE": bundle,
        "CURL_CA_BUNDLE": bundle,
        "GIT_SSL_CAINFO": bundle,
        "NODE_EXTRA_CA_CERTS": bundle,
    }


def _trust_files(ca_pem: bytes, system_root: str | None, overlay: bool) -> list[tuple[int, str]]:
    """memfds of the CA bundle for :data:`CA_BUNDLE_PATH` and, with ``overlay``, of each system trust store file
    the view shows (a regular file under ``system_root``), that file's roots and the CA."""
    from ...process.egressca import TRUST_STORES, trust_bundle

    files: list[tuple[int, str]] = []
    try:
        files.append((data_fd(trust_bundle(ca_pem, system_root), "execspace-egress-trust"), CA_BUNDLE_PATH))
        for path in TRUST_STORES if overlay else ():
            host_path = f"{system_root or ''}{path}"
            try:
                if not stat.S_ISREG(os.lstat(host_path).st_mode):
                    continue
                roots = Path(host_path).read_bytes()
            except OSError:
                continue
            files.append((data_fd(roots.rstrip(b"\n") + b"\n" + ca_pem, "execspace-egress-trust"), path))
    except BaseException:
        for fd, _ in files:
            os.close(fd)
        raise
    return files
