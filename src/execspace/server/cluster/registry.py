"""The cluster's registry: which node holds each sandbox (and snapshot), and each node's slots.

One named detached Ray actor (docs/cluster.md). Its state heals from the nodes' truth: every agent reports the
sandboxes its server holds each second, so a sandbox that expired or was killed leaves the map, and a registry that
was lost and started again learns the map back within a report.
"""

from __future__ import annotations

import itertools
import time

__all__ = ["Registry"]

#: Seconds a sandbox bound by a front door stays in the map without its node reporting it (the report may have
#: been taken before the create finished).
_FRESH = 10.0
#: Seconds a reserved slot waits for its create to finish (an environment's first build on a node can be long).
_RESERVED = 600.0


class Registry:
    def __init__(self) -> None:
        self._where: dict[str, str] = {}  # sandbox id -> node id
        self._snapshots: dict[str, str] = {}  # snapshot id -> node id (a snapshot stays on its node)
        self._bound_at: dict[str, float] = {}
        self._slots: dict[str, int] = {}
        self._held: dict[str, int] = {}
        self._reserved: dict[str, dict[int, float]] = {}  # node -> reservation -> deadline
        self._tokens = itertools.count(1)

    def report(self, node_id: str, slots: int, held: list[str]) -> None:
        """A node's agent says what its server holds now."""
        now = time.monotonic()
        self._slots[node_id] = slots
        self._held[node_id] = len(held)
        current = set(held)
        for sandbox_id in current:
            self._where[sandbox_id] = node_id
        gone = [
            s
            for s, n in self._where.items()
            if n == node_id and s not in current and now - self._bound_at.get(s, 0.0) > _FRESH
        ]
        for sandbox_id in gone:
            self._forget(sandbox_id)

    def place(self, alive: list[str], exclude: list[str], only: str | None, slots: int) -> tuple[str, int] | None:
        """Reserve a slot on the living node with the most free slots (or on ``only``): (node, reservation), or
        None when every one is full. A node whose agent has not reported yet has ``slots`` (the front door's
        ``max_sandboxes``)."""
        now = time.monotonic()
        best: tuple[int, str] | None = None
        for node_id in alive:
            if node_id in exclude or (only is not None and node_id != only):
                continue
            reserved = self._reserved.setdefault(node_id, {})
            for token in [t for t, deadline in reserved.items() if deadline < now]:
                del reserved[token]
            free = self._slots.get(node_id, slots) - self._held.get(node_id, 0) - len(reserved)
            if free > 0 and (best is None or free > best[0]):
                best = (free, node_id)
        if best is None:
            return None
        token = next(self._tokens)
        self._reserved[best[1]][token] = now + _RESERVED
        return best[1], token

    def bind(self, node_id: str, token: int, object_id: str | None) -> None:
        """The create of a reservation ended: ``object_id`` (a sandbox's) now lives on ``node_id``, or None."""
        self._reserved.get(node_id, {}).pop(token, None)
        if object_id is not None:
            self.add(node_id, object_id)

    def add_snapshot(self, node_id: str, snapshot_id: str) -> None:
        self._snapshots[snapshot_id] = node_id

    def add(self, node_id: str, object_id: str) -> None:
        """A sandbox (made by a create or a fork) now lives on ``node_id``."""
        self._where[object_id] = node_id
        self._bound_at[object_id] = time.monotonic()
        self._held[node_id] = self._held.get(node_id, 0) + 1

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
        self._slots.pop(node_id, None)
        self._held.pop(node_id, None)
        self._reserved.pop(node_id, None)

    def _forget(self, object_id: str) -> None:
        node_id = self._where.pop(object_id, None)
        self._bound_at.pop(object_id, None)
        if node_id is not None and self._held.get(node_id, 0) > 0:
            self._held[node_id] -= 1
