"""The registry's map heals from the nodes' reports: what a node stops reporting leaves it (after a fresh add's
grace), a lost node takes its sandboxes and snapshots with it; its request to Ray's autoscaler asks for the slots
held and waited for, and is withdrawn once met. Plain Python: the actor is this class."""

from __future__ import annotations

import pytest

from execspace.server.cluster import demand, registry
from execspace.server.cluster.demand import QUIET_FOR, SERVED_FOR, WAITING_FOR, Demand
from execspace.server.cluster.nodeconfig import SLOT, node_slots
from execspace.server.cluster.registry import Registry


def test_a_report_is_the_nodes_truth() -> None:
    reg = Registry()
    reg.report("a", 4, ["s1", "s2"])
    reg.report("b", 4, ["s3"])
    assert (reg.where("s1"), reg.where("s3")) == ("a", "b")
    assert reg.load() == {"a": (4, 2), "b": (4, 1)}
    reg.report("a", 4, ["s2"])  # s1 expired or was killed on its node
    assert reg.where("s1") is None and reg.load()["a"] == (4, 1)


def test_a_sandbox_just_added_outlives_a_report_taken_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(registry.time, "monotonic", lambda: now[0])
    reg = Registry()
    reg.add("a", "new")
    reg.report("a", 4, [])  # taken before the create finished
    assert reg.where("new") == "a"
    now[0] += 60
    reg.report("a", 4, [])  # the node no longer holds it
    assert reg.where("new") is None


def test_a_front_doors_batch_is_applied_in_its_order() -> None:
    reg = Registry()
    reg.apply([("add", "a", "s1"), ("add", "b", "s2"), ("snapshot", "a", "snap"), ("forget", "", "s1")])
    assert (reg.where("s1"), reg.where("s2"), reg.where("snap")) == (None, "b", "a")
    reg.apply([("forget", "", "s2"), ("add", "a", "s2")])  # an id the batch names twice ends as its last change
    assert reg.where("s2") == "a"


def test_a_dropped_node_takes_its_sandboxes_and_snapshots() -> None:
    reg = Registry()
    reg.report("a", 4, ["s1"])
    reg.report("b", 4, ["s2"])
    reg.add_snapshot("a", "snap")
    reg.drop_node("a")
    assert (reg.where("s1"), reg.where("snap"), reg.where("s2")) == (None, None, "b")
    assert reg.load() == {"b": (4, 1)}


class _Autoscaler:
    """Ray's autoscaler as the registry sees it: the standing requests it got, the slots the cluster has."""

    def __init__(self) -> None:
        self.requests: list[int] = []
        self.slots = 0
        self.fails = False

    def request(self, slots: int) -> None:
        if self.fails:
            raise ConnectionError("the GCS does not answer")
        self.requests.append(slots)

    def capacity(self) -> int:
        return self.slots


def test_refused_creates_ask_for_the_held_slots_and_one_per_create_that_waits() -> None:
    now = [100.0]
    scaler = _Autoscaler()
    wanted = Demand(scaler, clock=lambda: now[0])
    wanted.refused(held=7)
    wanted.refused(held=7)  # a second create waits within the Retry-After
    assert scaler.requests == [8, 9]
    now[0] += 5 * WAITING_FOR
    wanted.refused(held=7)  # one waits now: the standing request (each call replaces it) is not made smaller
    assert scaler.requests == [8, 9] and wanted.standing == 9


def test_the_request_is_withdrawn_once_the_nodes_came_and_the_waiting_creates_were_served() -> None:
    now = [100.0]
    scaler = _Autoscaler()
    wanted = Demand(scaler, clock=lambda: now[0])
    wanted.settle()  # no request stands: nothing withdrawn
    wanted.refused(held=2)
    scaler.slots = 2
    now[0] += SERVED_FOR
    wanted.settle()  # the cluster's 2 slots do not cover 3
    scaler.slots = 5  # the autoscaler added a node of 3
    now[0] += 0.5
    wanted.settle()  # not looked at again yet (once a second)
    wanted.refused(held=5)  # the new node filled up at once: one more waits
    now[0] += 1
    wanted.settle()  # its 6 slots are not there: the request stands
    assert scaler.requests == [3, 6]
    scaler.slots = 8
    now[0] += SERVED_FOR - 2  # the last create waited SERVED_FOR - 1 ago
    wanted.settle()  # covered, but a create waited within SERVED_FOR: it may not have landed yet
    assert scaler.requests == [3, 6]
    now[0] += 1
    wanted.settle()
    assert scaler.requests == [3, 6, 0] and wanted.standing == 0


def test_the_registry_keeps_the_request_and_settles_it_on_the_nodes_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(demand.time, "monotonic", lambda: now[0])
    scaler = _Autoscaler()
    reg = Registry(scaler)
    reg.refused(2)
    scaler.slots = 5
    reg.report("a", 2, ["s1", "s2"])
    assert scaler.requests == [3]  # just refused: the waiting create has not landed yet
    now[0] += SERVED_FOR
    reg.report("a", 2, ["s1", "s2"])
    assert scaler.requests == [3, 0]


def test_a_request_nobody_waits_for_is_withdrawn_and_a_failed_one_is_asked_again() -> None:
    now = [100.0]
    scaler = _Autoscaler()
    wanted = Demand(scaler, clock=lambda: now[0])
    scaler.fails = True
    wanted.refused(held=4)
    assert wanted.standing == 0  # not asked: the next refusal asks again
    scaler.fails = False
    wanted.refused(held=4)
    assert scaler.requests == [6]
    now[0] += QUIET_FOR / 2
    wanted.settle()  # the nodes have not come, clients still wait
    assert scaler.requests == [6]
    now[0] += QUIET_FOR
    wanted.settle()
    assert scaler.requests == [6, 0]


def test_a_node_holds_what_its_resource_declares_else_the_default() -> None:
    assert node_slots({"CPU": 4.0, SLOT: 5.0}, 100) == 5
    assert node_slots({"CPU": 4.0}, 100) == 100
    assert node_slots({"CPU": 4.0}, 0) == 0  # Ray drops a resource declared 0: a default of 0 keeps such nodes empty
