"""The front door's view of the cluster through Ray: living nodes, their agents (started on demand), the registry.

Every Ray call of a front door is here. Blocking ones (``ray.nodes()``, getting or creating a named actor) run in
a thread; actor calls are awaited as the futures they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from ...errors import SetupFailed
from .agent import NodeAgent
from .nodeconfig import SLOT, AgentConfig, Endpoint, node_slots
from .registry import Registry

__all__ = ["NAMESPACE", "Nodes", "agent_name"]

_log = logging.getLogger("execspace.server.cluster")

NAMESPACE = "execspace"
REGISTRY = "execspace-registry"
#: Seconds between the front door's looks at the cluster's nodes.
WATCH_INTERVAL = 1.0
#: Seconds a node whose server refused a connection is left out of placement before it is tried again.
_LOST_FOR = 30.0
#: Seconds the cluster's address has to accept a connection.
_JOIN_TIMEOUT = 10.0
#: Seconds a front door gathers its creates' and kills' changes before it tells the registry in one call: an actor
#: call costs the front door's loop about 0.4 ms, a third of what a create through it costs over one host.
_BATCH_DELAY = 0.05
#: Sandbox ids whose node a front door remembers (each a few hundred bytes); past it the cache starts again.
_CACHED = 100_000


def agent_name(node_id: str) -> str:
    return f"execspace-agent-{node_id}"


def connect(address: str, component: str = "execspace serve --ray") -> None:
    """Join the Ray cluster at ``address`` as a driver (what ``ray.init(address=...)`` takes); ``component`` names
    the command in its errors."""
    # Ray folds log lines of several workers that differ only in numbers and ids into one "[repeated Nx across
    # cluster]": the nodes' lines that say the same of different nodes (an environment's build on each) must all
    # reach the operator. Read when Ray is first imported; an operator's own setting wins.
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    try:
        import ray
    except ImportError:
        raise SetupFailed(
            "serve",
            f"{component} needs Ray, which is not installed",
            "pip install 'execspace[ray]'",
            component=component,
        ) from None
    _reachable(address, component)
    try:
        ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise _cannot_join(address, exc, component) from None


def _reachable(address: str, component: str) -> None:
    """Fail at once, naming the address, where nothing listens at a ``HOST:PORT`` GCS address (``ray.init`` would
    retry it for minutes)."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return  # auto, ray://…: ray.init finds (or refuses) them itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=_JOIN_TIMEOUT).close()
    except OSError as exc:
        raise _cannot_join(address, exc, component) from None


def _cannot_join(address: str, why: Exception, component: str) -> SetupFailed:
    return SetupFailed(
        "serve",
        f"cannot join the Ray cluster at {address}: {why}",
        "give --ray the address `ray start --head` printed (HOST:6379), or `auto` on a node of the cluster",
        component=component,
    )


class Nodes:
    """The living nodes, their agents and the registry, as one front door sees them."""

    def __init__(self, config: AgentConfig) -> None:
        self._config = config
        self._alive: set[str] = set()  # the living nodes that hold sandboxes (one slot or more)
        self._dead = 0  # the nodes Ray reports dead (it keeps them listed for a while)
        self._load: dict[str, tuple[int, int]] = {}  # node id -> (slots, held), the registry's last count
        self._slots: dict[str, int] = {}  # living node id -> its slots
        self._declared: set[str] = set()  # the living nodes that declare their slots as a Ray resource
        self._head: str | None = None
        self._lost: dict[str, float] = {}  # node id -> when its server was found gone
        self._agents: dict[str, asyncio.Future[Endpoint]] = {}
        self._handles: dict[str, Any] = {}  # node id -> its agent actor
        self._free: dict[str, int] = {}  # node id -> free slots, by the registry's count and this door's creates
        self._where: dict[str, str] = {}
        self._cuts: dict[str, asyncio.Event] = {}
        self._registry: Any = None
        self._changes: list[tuple[str, str, str]] = []  # for the registry, in order (:meth:`Registry.apply`)
        self._on_gone: list[Callable[[str, Endpoint | None], None]] = []

    async def open(self) -> None:
        await self._refresh()
        self._registry = await asyncio.to_thread(self._get_registry)

    # --- nodes -----------------------------------------------------------------------------------------------

    def alive(self) -> list[str]:
        """The nodes that can take sandboxes: alive in Ray, with a slot or more, their server not found gone lately."""
        now = time.monotonic()
        return [n for n in self._alive if now - self._lost.get(n, -_LOST_FOR) >= _LOST_FOR]

    def serving(self, node_id: str) -> bool:
        """Whether a node's sandboxes can still be reached (alive in Ray, its server not found gone)."""
        return node_id in self._alive and node_id not in self._lost

    async def watch(self) -> None:
        """Follow the cluster's nodes until cancelled: a node Ray reports dead is gone, with its sandboxes."""
        while True:
            with contextlib.suppress(Exception):  # a GCS that does not answer now: the last view stands
                await self._refresh()
                await self.count()
            await asyncio.sleep(WATCH_INTERVAL)

    async def _refresh(self) -> None:
        import ray

        listed = await asyncio.to_thread(ray.nodes)
        found = [n for n in listed if n.get("Alive")]
        self._dead = len(listed) - len(found)
        self._slots = {n["NodeID"]: node_slots(n.get("Resources", {}), self._config.slots) for n in found}
        self._declared = {n["NodeID"] for n in found if SLOT in n.get("Resources", {})}
        alive = {n for n, slots in self._slots.items() if slots > 0}
        for n in found:
            if "node:__internal_head__" in n.get("Resources", {}):
                self._head = n["NodeID"]
        for node_id in self._alive - alive:
            if node_id not in self._lost:  # else found gone already, with its sandboxes: one loss
                self._gone(node_id, "Ray reports the node dead")
            self._lost.pop(node_id, None)
        self._alive = alive

    def lost(self, node_id: str, why: str) -> None:
        """A node's server is gone (its address refuses connections): so are its sandboxes."""
        if node_id not in self._lost:
            self._gone(node_id, why)
        self._lost[node_id] = time.monotonic()

    def when_gone(self, callback: Callable[[str, Endpoint | None], None]) -> None:
        """Call ``callback`` with a node's id and its server's endpoint (None: none was started) when it goes."""
        self._on_gone.append(callback)

    def states(self) -> dict[str, int]:
        """How many nodes are in each state this front door knows: ``alive`` (taking sandboxes), ``lost`` (alive in
        Ray, its server found gone: left out for a while), ``no_slots`` (alive, declaring no slot: no agent),
        ``dead`` (Ray reports it dead)."""
        placing = self.alive()
        return {
            "alive": len(placing),
            "lost": len(self._alive) - len(placing),
            "no_slots": len(self._slots) - len(self._alive),
            "dead": self._dead,
        }

    def load(self) -> dict[str, tuple[int, int]]:
        """Each living node's slots and the sandboxes it held at its agent's last report (the registry's count,
        taken every :data:`WATCH_INTERVAL`)."""
        alive = set(self.alive())
        return {n: load for n, load in self._load.items() if n in alive}

    def endpoints(self) -> list[Endpoint]:
        """The servers of the living nodes whose agent this front door started or found."""
        alive = set(self.alive())
        return [
            started.result()
            for node_id, started in self._agents.items()
            if node_id in alive and started.done() and not started.cancelled() and started.exception() is None
        ]

    def _gone(self, node_id: str, why: str) -> None:
        _log.warning("node %s is gone (%s): its sandboxes are lost", node_id, why)
        started = self._agents.pop(node_id, None)
        ran = started is not None and started.done() and not started.cancelled() and started.exception() is None
        for callback in self._on_gone:
            callback(node_id, started.result() if ran and started is not None else None)
        self._handles.pop(node_id, None)
        for object_id in [s for s, n in self._where.items() if n == node_id]:
            del self._where[object_id]
        self._cuts.pop(node_id, asyncio.Event()).set()
        if self._registry is not None:
            self._registry.drop_node.remote(node_id)

    def cut(self, node_id: str) -> asyncio.Event:
        """Set when ``node_id`` goes: the traffic proxied to it is cut then."""
        return self._cuts.setdefault(node_id, asyncio.Event())

    # --- agents ----------------------------------------------------------------------------------------------

    async def agent(self, node_id: str) -> Endpoint:
        """The endpoint of ``node_id``'s server, its agent started if none runs."""
        found = self._agents.get(node_id)
        if found is None or (found.done() and (found.cancelled() or found.exception() is not None)):
            found = self._agents[node_id] = asyncio.ensure_future(self._start(node_id))
        return await asyncio.shield(found)

    async def _start(self, node_id: str) -> Endpoint:
        try:
            config = self._config.on_node(self._slots.get(node_id, self._config.slots))
            handle = self._handles[node_id] = await asyncio.to_thread(self._get_agent, node_id)
            endpoint: Endpoint = await handle.start.remote(config)
        except Exception as exc:  # Ray's errors: the actor died, could not be placed, its start raised
            raise SetupFailed(
                "serve",
                str(exc),
                "see its output in this front door's log (Ray forwards it); creates go to the other nodes meanwhile",
                component=f"the agent of node {node_id}",
            ) from None
        if endpoint.key_ids != self._config.key_ids():
            raise SetupFailed(
                "serve",
                "it serves other API keys than this front door",
                "start every front door of a cluster with the same --api-key/--admin-api-key values, or stop the "
                f"agents (ray.kill of the actors {agent_name(node_id)!r}… in namespace {NAMESPACE!r}) to change them",
                component=f"the agent of node {node_id}",
            )
        self._lost.pop(node_id, None)  # a server of its own again: what it holds from now on can be reached
        return endpoint

    def _get_agent(self, node_id: str) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor = ray.remote(NodeAgent).options(
            name=agent_name(node_id),
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        )
        return actor.remote(node_id, self._registry)

    def _get_registry(self) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # on the head, with the GCS: a worker node that dies must not take the map with it (soft, Ray would place it
        # on a worker whenever it liked)
        strategy = NodeAffinitySchedulingStrategy(self._head, soft=False) if self._head else "DEFAULT"
        return (
            ray.remote(Registry)
            .options(
                name=REGISTRY,
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                num_cpus=0,
                max_restarts=-1,  # a new one learns the map back from the agents' reports
                scheduling_strategy=strategy,
            )
            .remote()
        )

    # --- the map ---------------------------------------------------------------------------------------------

    async def locate(self, object_id: str) -> str | None:
        """The node of a sandbox or snapshot while it can be reached, else None. One the registry does not know
        (it was restarted, or a front door's add has not reached it yet) is asked of the living nodes' agents."""
        node_id = self._where.get(object_id)
        if node_id is None:
            node_id = await self._ask("where", object_id) or await self._held_by(object_id)
            if node_id is not None:
                self._remember(object_id, node_id)
        return node_id if node_id is not None and self.serving(node_id) else None

    async def _held_by(self, sandbox_id: str) -> str | None:
        nodes = [n for n in self.alive() if n in self._handles]
        answers = await asyncio.gather(
            *(self._handles[n].holds.remote(sandbox_id) for n in nodes), return_exceptions=True
        )
        return next((n for n, held in zip(nodes, answers, strict=True) if held is True), None)

    def choose(self, exclude: list[str], only: str | None) -> str | None:
        """The living node with the most free slots by the registry's last count and this front door's creates
        since (or ``only``), counted as taken; None when every one is full. The node's server has the last word:
        a create it refuses (429) is tried on the next node."""
        free = {
            n: self._free.get(n, self._slots.get(n, 0))
            for n in self.alive()
            if n not in exclude and (only is None or n == only)
        }
        best = max(free, key=lambda n: free[n], default=None)
        if best is None or free[best] <= 0:
            return None
        self._free[best] = free[best] - 1
        return best

    def release(self, node_id: str) -> None:
        """A create :meth:`choose` counted on ``node_id`` made nothing there: its slot is free again."""
        if node_id in self._free:
            self._free[node_id] += 1

    def full(self, node_id: str) -> None:
        """A node's server refused a create: no slot there until its next count."""
        self._free[node_id] = 0

    def waiting(self) -> None:
        """A create found every node full: the registry asks Ray's autoscaler for the slots of the nodes that
        declare them (every one taken) and one more, without this front door waiting for it."""
        held = sum(self._slots[n] for n in self.alive() if n in self._declared)
        self._registry.refused.remote(held)

    async def count(self) -> None:
        """Take the registry's count of each node's sandboxes."""
        self._load = await self._ask("load")
        self._free = {n: slots - held for n, (slots, held) in self._load.items()}

    def add(self, node_id: str, object_id: str, *, snapshot: bool = False) -> None:
        """A sandbox (a snapshot) now lives on ``node_id``: told to the registry in this front door's next batch,
        without waiting for it (a front door that asks before the registry has it finds the node by asking the
        agents)."""
        self._remember(object_id, node_id)
        self._tell("snapshot" if snapshot else "add", node_id, object_id)

    def forget(self, object_id: str) -> None:
        self._where.pop(object_id, None)
        self._tell("forget", "", object_id)

    def _tell(self, kind: str, node_id: str, object_id: str) -> None:
        """Queue a change for the registry; the first of a batch schedules the batch's one call."""
        if not self._changes:
            asyncio.get_running_loop().call_later(_BATCH_DELAY, self._flush)
        self._changes.append((kind, node_id, object_id))

    def _flush(self) -> None:
        changes, self._changes = self._changes, []
        self._registry.apply.remote(changes)

    async def _ask(self, method: str, *args: Any) -> Any:
        """A call of the registry; one that fails is a :class:`SetupFailed` (503) naming what to do."""
        try:
            return await getattr(self._registry, method).remote(*args)
        except Exception as exc:  # Ray's errors: the registry is being restarted, the GCS does not answer
            raise SetupFailed(
                "serve",
                f"the cluster's registry does not answer now ({type(exc).__name__}: {exc})",
                "retry in a moment: Ray restarts it and it learns the map back from the agents' next reports",
                component="execspace serve --ray",
            ) from None

    def _remember(self, object_id: str, node_id: str) -> None:
        if len(self._where) >= _CACHED:
            self._where.clear()
        self._where[object_id] = node_id
