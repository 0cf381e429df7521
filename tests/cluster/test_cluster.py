"""serve --ray through the official SDK: sandboxes spread over the nodes of a local Ray cluster, reachable through
any front door (a restarted one too), listed with their node, refused with 429 when every node is full, and gone
from every node once killed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import Sandbox
from e2b.exceptions import RateLimitException

from .conftest import PER_NODE, FrontDoor, LocalCluster, client_id, sleepers, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def door(local_cluster: LocalCluster) -> Iterator[FrontDoor]:
    with local_cluster.front_door() as front:
        yield front


def test_sandboxes_spread_over_the_nodes_and_answer_through_either_front_door(
    local_cluster: LocalCluster, door: FrontDoor
) -> None:
    boxes = [Sandbox.create(timeout=120, **door.sdk()) for _ in range(6)]
    try:
        nodes = {b.sandbox_id: client_id(door, b.sandbox_id) for b in boxes}
        assert set(nodes.values()) <= local_cluster.node_ids() and len(set(nodes.values())) == 3, nodes
        with local_cluster.front_door() as other:
            for i, box in enumerate(boxes):
                there = Sandbox.connect(box.sandbox_id, **other.sdk())
                there.files.write("/home/user/n.txt", f"box {i}")
                assert there.commands.run("cat /home/user/n.txt", timeout=30).stdout == f"box {i}"
                there.commands.run("sleep 86391", background=True)
            until("each sandbox runs its marked program", lambda: len(sleepers(86391)) == len(boxes))
            listed = {s.sandbox_id: s for s in Sandbox.list(**other.sdk()).next_items()}
            assert set(listed) == set(nodes)
            pages, paged = Sandbox.list(limit=4, **other.sdk()), []
            while pages.has_next:  # pages cut across the nodes' lists: each sandbox once
                paged += [s.sandbox_id for s in pages.next_items()]
            assert sorted(paged) == sorted(nodes)
            assert {i: client_id(other, i) for i in nodes} == nodes
    finally:
        for box in boxes:
            box.kill()
    assert Sandbox.list(**door.sdk()).next_items() == []
    until("the programs of the killed sandboxes ended, on every node", lambda: not sleepers(86391))


def test_a_restarted_front_door_reaches_the_sandboxes_of_the_one_before(local_cluster: LocalCluster) -> None:
    with local_cluster.front_door() as first:
        box = Sandbox.create(timeout=120, **first.sdk())
        box.commands.run("echo kept > /home/user/kept.txt")
        box.commands.run("sleep 86392", background=True)
    try:
        with local_cluster.front_door() as second:
            again = Sandbox.connect(box.sandbox_id, **second.sdk())
            assert again.commands.run("cat /home/user/kept.txt").stdout == "kept\n"
            again.kill()
    finally:
        until("the sandbox's program ended", lambda: not sleepers(86392))


def test_a_full_cluster_answers_429_and_takes_creates_again_once_one_ends(door: FrontDoor) -> None:
    boxes = [Sandbox.create(timeout=120, **door.sdk()) for _ in range(3 * PER_NODE)]
    for box in boxes:
        box.commands.run("sleep 86393", background=True)
    try:
        with pytest.raises(RateLimitException):
            Sandbox.create(timeout=120, **door.sdk())
        boxes.pop().kill()
        until("the registry saw the slot free", lambda: _creates(door), within=20)
    finally:
        for box in boxes:
            box.kill()
        for box in Sandbox.list(**door.sdk()).next_items():
            Sandbox.kill(box.sandbox_id, **door.sdk())
    until("the programs of the killed sandboxes ended, on every node", lambda: not sleepers(86393))


def _creates(door: FrontDoor) -> bool:
    try:
        Sandbox.create(timeout=120, **door.sdk())
    except RateLimitException:
        return False
    return True
