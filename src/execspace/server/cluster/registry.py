"""The cluster's registry: which node holds each sandbox (and snapshot), and how full each node is.

One named detached Ray actor on the head node (docs/cluster.md). Its state heals from the nodes' truth: every agent
reports the sandboxes its server holds each second, so a sandbox that expired or was killed leaves the map, and a
registry that was lost and started again learns the map back within a report. It also keeps the cluster's one
request to Ray's autoscaler (:mod:`.demand`).
"""

from __future__ import annotations

import time

from .demand import Autoscaler, Demand, RayAutoscaler

__all__ = ["Registry"]

#: Seconds a sandbox added by a front door stays in the map without its node reporting it (the report may have
#: been taken before the create finished).
_FRESH = 10.0


class Registry:
    def __init__(self, autoscaler: Autoscaler | None = None) -> None:
        self._demand = Demand(autoscaler or RayAutoscaler())
        self._where: dict[str, str] = {}  # sandbox id -> node id
        self._added_at: dict[str, float] = {}
        self._snapshots: dict[str, str] = {}  # snapshot id -> node id (a snapshot stays on its node)
        self._load: dict[str, tuple[int, int]] = {}  # node id -> (slots, sandboxes held)

    def report(self, node_id: str, slots: int, held: list[str]) -> None:
        """A node's agent says what its server holds now."""
        now = time.monotonic()
        self._load[node_id] = (slots, len(held))
        current = set(held)
        for sandbox_id in current:
            self._where[sandbox_id] = node_id
        gone = [
            s
            for s, n in self._where.items()
            if n == node_id and s not in current and now - self._added_at.get(s, 0.0) > _FRESH
        ]
        for sandbox_id in gone:
            self._forget(sandbox_id)
        self._demand.settle()  # the reports are the registry's clock: each second, from each node

    def load(self) -> dict[str, tuple[int, int]]:
        """Each reporting node's slots and the sandboxes it held at its last report."""
        return dict(self._load)

    def refused(self, held: int) -> None:
        """A front door refused a create, every node full, ``held`` slots taken on the nodes that declare them."""
        self._demand.refused(held)

    def add(self, node_id: str, sandbox_id: str) -> None:
        """A sandbox (made by a create or a fork) now lives on ``node_id``."""
        self._where[sandbox_id] = node_id
        self._added_at[sandbox_id] = time.monotonic()

    def add_snapshot(self, node_id: str, snapshot_id: str) -> None:
        self._snapshots[snapshot_id] = node_id

    def apply(self, changes: list[tuple[str, str, str]]) -> None:
        """A front door's batch of changes, in the order they happened: ``("add", node, id)``, ``("snapshot", node,
        id)``, ``("forget", "", id)``."""
        for kind, node_id, object_id in changes:
            if kind == "add":
                self.add(node_id, object_id)
            elif kind == "snapshot":
                self.add_snapshot(node_id, object_id)
            else:
                self.forget(object_id)

    def where(self, object_id: str) -> str | None:
        """The node of a sandbox or a snapshot."""
        return self._where.get(object_id) or self._snapshots.get(object_id)

    def forget(self, object_id: str) -> None:
        self._forget(object_id)
        self._snapshots.pop(object_id, None)

    def drop_node(self, node_id: str) -> None:
        """A node is gone, with everything it held."""
        for object_id in [s for s, n in self._where.items() if n == node_id]:
            self._forget(object_id)
        for snapshot_id in [s for s, n in self._snapshots.items() if n == node_id]:
            del self._snapshots[snapshot_id]
        self._load.pop(node_id, None)

    def _forget(self, object_id: str) -> None:
        self._where.pop(object_id, None)
        self._added_at.pop(object_id, None)
