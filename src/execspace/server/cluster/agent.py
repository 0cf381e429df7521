"""The node agent: one detached Ray actor per node that runs the node's server and reports what it holds.

See docs/cluster.md. The actor class is plain Python; :class:`.nodes.Nodes` makes it a Ray actor, pinned to its node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from ..options import generate_api_key
from .nodeconfig import AgentConfig, Endpoint, encode_node_server, node_server

__all__ = ["NodeAgent"]

_log = logging.getLogger("execspace.server.cluster")

#: Seconds between the agent's reports of its sandboxes to the registry.
REPORT_INTERVAL = 1.0
#: Seconds the node's server has to start listening.
_START_TIMEOUT = 120.0


class NodeAgent:
    """Starts the node's server once (the first front door's options win: see docs/cluster.md) and reports its
    sandboxes to the registry every :data:`REPORT_INTERVAL`."""

    def __init__(self, node_id: str, registry: Any) -> None:
        self._node_id = node_id
        self._registry = registry
        self._key = generate_api_key()
        self._started: asyncio.Future[Endpoint] | None = None
        self._child: asyncio.subprocess.Process | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, config: AgentConfig) -> Endpoint:
        """The node server's endpoint, started with ``config`` if it is not running yet."""
        ended = self._child is not None and self._child.returncode is not None  # the server died: start another
        if self._started is None or ended or (self._started.done() and self._started.exception() is not None):
            for task in self._tasks:
                task.cancel()
            self._started = asyncio.ensure_future(self._start(config))
        return await asyncio.shield(self._started)

    async def _start(self, config: AgentConfig) -> Endpoint:
        import ray

        host: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        raylet = _raylet()
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "execspace.server.cluster.nodeserve",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        self._child = child
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(encode_node_server(node_server(config, host, self._key, raylet, self._node_id)))
        await child.stdin.drain()
        line = await asyncio.wait_for(child.stdout.readline(), _START_TIMEOUT)
        word, _, address = line.decode().strip().partition(" ")
        if word != "READY":
            raise RuntimeError(f"the node server on {host} did not start (exit {await child.wait()}): see its log")
        listen_host, _, port = address.partition(" ")
        url = f"http://{_url_host(listen_host)}:{port}"
        endpoint = Endpoint(self._node_id, url, config.key_ids(), config.options.max_sandboxes)
        self._tasks = [asyncio.create_task(self._drain(child)), asyncio.create_task(self._report(endpoint))]
        return endpoint

    async def endpoint(self) -> Endpoint | None:
        """The running server's endpoint, None before :meth:`start`."""
        if self._started is None or not self._started.done() or self._started.exception() is not None:
            return None
        return self._started.result()

    async def holds(self, sandbox_id: str) -> bool:
        """Whether the node's server holds that sandbox now."""
        endpoint = await self.endpoint()
        if endpoint is None:
            return False
        async with httpx.AsyncClient(headers={"X-API-KEY": self._key}, timeout=10) as client:
            return (await client.get(f"{endpoint.url}/sandboxes/{sandbox_id}")).status_code == 200

    async def stop(self) -> None:
        """End the node's server (its sandboxes are killed) and this agent's reports."""
        for task in self._tasks:
            task.cancel()
        if self._child is not None and self._child.returncode is None:
            self._child.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._child.wait(), 60)

    async def _drain(self, child: asyncio.subprocess.Process) -> None:
        """The server's stdout after its ready line, passed on to this worker's (Ray's log)."""
        assert child.stdout is not None
        while line := await child.stdout.readline():
            print(line.decode(errors="replace"), end="", flush=True)

    async def _report(self, endpoint: Endpoint) -> None:
        """Tell the registry which sandboxes the node's server holds, every :data:`REPORT_INTERVAL`."""
        async with httpx.AsyncClient(base_url=endpoint.url, headers={"X-API-KEY": self._key}, timeout=10) as client:
            while True:
                try:
                    answer = await client.get("/sandboxes")
                    if answer.status_code == 200:
                        held = [s["sandboxID"] for s in answer.json()]
                        await self._registry.report.remote(self._node_id, endpoint.slots, held)
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    _log.warning("node %s: cannot list its sandboxes: %s", self._node_id[:12], exc)
                await asyncio.sleep(REPORT_INTERVAL)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _raylet() -> int | None:
    """The pid of this node's raylet: the parent of its workers (None where this worker has another)."""
    parent = os.getppid()
    try:
        name = Path(f"/proc/{parent}/comm").read_text().strip()
    except OSError:
        return None
    return parent if name.startswith("raylet") else None
