"""A node removed from the cluster (its raylet killed, as a machine that dies) takes only its own sandboxes: a
command running there fails its caller promptly, the sandbox answers not found, nothing of it keeps running, the
other nodes' sandboxes carry on and new sandboxes land on the living nodes."""

from __future__ import annotations

import concurrent.futures
import time

import pytest
from e2b import Sandbox
from e2b.exceptions import NotFoundException, SandboxException

from tests.support import until

from .conftest import LocalCluster, client_id, node_servers, servers_on, sleepers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_a_node_removed_during_a_command_fails_it_promptly_and_keeps_the_other_nodes(
    local_cluster: LocalCluster,
) -> None:
    with local_cluster.front_door() as door:
        boxes = [Sandbox.create(timeout=120, **door.sdk()) for _ in range(3)]
        where = {b.sandbox_id: client_id(door, b.sandbox_id) for b in boxes}
        worker = next(w for w in local_cluster.workers() if str(w.node_id) in where.values())
        victim = str(worker.node_id)
        lost = [b for b in boxes if where[b.sandbox_id] == victim]
        kept = [b for b in boxes if where[b.sandbox_id] != victim]
        assert lost and kept, where
        servers = set(node_servers())
        others = [n for n in local_cluster.node_ids() if n != victim]
        assert [servers_on(n) for n in others] == [1] * len(others)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(lost[0].commands.run, "sleep 86394", timeout=0)
            until("the command runs", lambda: sleepers(86394))
            local_cluster.cluster.remove_node(worker, allow_graceful=False)
            removed = time.monotonic()
            failed = running.exception(timeout=30)  # a command that hangs fails the test here (TimeoutError)
        took = time.monotonic() - removed
        # the SDK's "sandbox was killed" (SandboxNotRunningException): the proxied stream was reset at once
        assert isinstance(failed, SandboxException) and took < 15, (failed, took)
        for box in lost:
            with pytest.raises(NotFoundException):
                Sandbox.connect(box.sandbox_id, **door.sdk())
        until("the removed node's sandboxes and server ended", lambda: not sleepers(86394))
        # the removed node's server ended, the others' did not (a server another module left ending meanwhile is
        # no concern of this test's)
        assert servers - set(node_servers()) and [servers_on(n) for n in others] == [1] * len(others)
        assert {s.sandbox_id for s in Sandbox.list(**door.sdk()).next_items()} == {b.sandbox_id for b in kept}
        for box in kept:
            assert Sandbox.connect(box.sandbox_id, **door.sdk()).commands.run("echo up").stdout == "up\n"
        new = [Sandbox.create(timeout=120, **door.sdk()) for _ in range(3)]
        assert victim not in {client_id(door, b.sandbox_id) for b in new}
        for box in kept + new:
            box.kill()
