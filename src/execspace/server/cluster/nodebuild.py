"""An environment built ahead on every living node of a Ray cluster: ``execspace env build NAME --ray ADDRESS``.

One Ray task per node, pinned to it (``NodeAffinitySchedulingStrategy(node, soft=False)``, no CPU asked: it must
not wait for a slot of the node's workload), builds the spec into the node's own store (``EXECSPACE_ENVIRONMENTS``
of the node's Ray processes, else the default: as the node's servers find it) and streams each step back as it
comes (a Ray generator task). The store's lock makes a node server's own build of the same spec, started by a
create meanwhile, a wait for this one (or this one a wait for it).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ...environments import BuildEvent, EnvironmentSpec, EnvironmentStore
from ...errors import EnvironmentBuildFailed
from .nodes import connect

__all__ = ["NodeBuild", "build_on_every_node"]


@dataclass(frozen=True, slots=True)
class NodeBuild:
    """How the build went on one node: the tree's path, or why it failed."""

    node_id: str
    address: str
    path: str = ""
    error: str = ""

    @property
    def name(self) -> str:
        return f"node {self.node_id} ({self.address})"


def build_on_every_node(spec: EnvironmentSpec, address: str, show: Callable[[str, str], None]) -> list[NodeBuild]:
    """Build ``spec`` on every living node of the cluster at ``address`` at once; ``show(node, line)`` is called
    with each step of each node as it comes (from several threads, one line at a time). Every node's outcome.

    Raises:
        SetupFailed: the cluster cannot be joined.
        EnvironmentBuildFailed: the cluster has no living node.
    """
    connect(address, "execspace env build --ray")  # first: it sets what Ray reads when it is first imported
    import ray

    try:
        listed: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
        nodes = [(n["NodeID"], n.get("NodeManagerAddress", "?")) for n in listed if n.get("Alive")]
        if not nodes:
            raise EnvironmentBuildFailed(f"the Ray cluster at {address} has no living node", "start one (ray start)")
        results: list[NodeBuild] = []
        lock = threading.Lock()

        def one(node_id: str, node_address: str) -> None:
            found = _follow(spec, node_id, node_address, show)
            with lock:
                results.append(found)

        threads = [threading.Thread(target=one, args=node, name=f"build-{node[0][:8]}") for node in nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sorted(results, key=lambda r: r.node_id)
    finally:
        ray.shutdown()


def _follow(spec: EnvironmentSpec, node_id: str, address: str, show: Callable[[str, str], None]) -> NodeBuild:
    """Run the build on ``node_id`` and pass its lines to ``show``; its outcome (a Ray failure too: the node died)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    where = NodeBuild(node_id, address).name
    task: Any = ray.remote(build_here).options(
        num_cpus=0,
        max_retries=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    )
    try:
        for ref in task.remote(spec):
            kind, text = ray.get(ref)
            if kind == "done":
                return NodeBuild(node_id, address, path=text)
            if kind == "failed":
                return NodeBuild(node_id, address, error=text)
            show(where, text)
    except Exception as exc:  # Ray's errors: the node died, the task could not be placed
        return NodeBuild(node_id, address, error=f"Ray lost the build ({type(exc).__name__}: {exc})")
    return NodeBuild(node_id, address, error="the build ended without a word")


def build_here(spec: EnvironmentSpec) -> Iterator[tuple[str, str]]:
    """The Ray task on a node: build ``spec`` into this node's store; yield ``("step", line)`` for each step, then
    ``("done", path)`` or ``("failed", why)``."""
    events: queue.Queue[tuple[str, str]] = queue.Queue()

    def progress(event: BuildEvent) -> None:
        if not event.output:
            events.put(("step", f"{event.step}: {event.text}"))

    def run() -> None:
        try:
            env = asyncio.run(EnvironmentStore().build(spec, progress=progress))
        except Exception as exc:  # said to the command, which names the node
            events.put(("failed", str(exc)))
        else:
            events.put(("done", str(env.path)))

    threading.Thread(target=run, name="build", daemon=True).start()
    while True:
        kind, text = events.get()
        yield kind, text
        if kind != "step":
            return
