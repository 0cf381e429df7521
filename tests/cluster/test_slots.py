"""Each node holds the sandboxes its ``execspace_sandbox`` Ray resource declares: nodes of 2 and 5 slots are filled
by their own limits (7 in all, then 429), and a node that declares none under ``--max-sandboxes 0`` (the head, kept
for Ray's control) holds none. With no autoscaler in the cluster, the request a full cluster makes of it changes
nothing the client sees: the 429 comes at once."""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox

from .conftest import API_KEY, LocalCluster, client_id, servers_on, started_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SLOT = "execspace_sandbox"


@pytest.fixture(scope="module")
def sized_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    workers = [{"resources": {SLOT: 2}}, {"resources": {SLOT: 5}}]
    with started_cluster(tmp_path_factory.mktemp("cluster"), {}, workers) as cluster:
        yield cluster


def test_nodes_of_two_and_five_slots_hold_seven_then_429_and_the_head_none(sized_cluster: LocalCluster) -> None:
    small, large = (str(n.node_id) for n in sized_cluster.added)
    with sized_cluster.front_door(per_node=0) as door:
        boxes = [Sandbox.create(timeout=120, **door.sdk()) for _ in range(7)]
        try:
            placed = collections.Counter(client_id(door, box.sandbox_id) for box in boxes)
            assert placed == {small: 2, large: 5}, placed  # the head, declaring none, holds none
            head = str(sized_cluster.cluster.head_node.node_id)
            assert [servers_on(n) for n in (head, small, large)] == [0, 1, 1]  # the head runs no agent's server
            started = time.monotonic()
            refused = httpx.post(f"{door.url}/sandboxes", json={"templateID": "base"}, headers={"X-API-KEY": API_KEY})
            took = time.monotonic() - started
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1", refused.text
            assert took < 1.0, took  # answered at once: the autoscaler is asked on the side
        finally:
            for box in boxes:
                box.kill()
