"""The registry's map heals from the nodes' reports: what a node stops reporting leaves it (after a fresh add's
grace), a lost node takes its sandboxes and snapshots with it. Plain Python: the actor is this class."""

from __future__ import annotations

import pytest

from execspace.server.cluster import registry
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


def test_a_dropped_node_takes_its_sandboxes_and_snapshots() -> None:
    reg = Registry()
    reg.report("a", 4, ["s1"])
    reg.report("b", 4, ["s2"])
    reg.add_snapshot("a", "snap")
    reg.drop_node("a")
    assert (reg.where("s1"), reg.where("snap"), reg.where("s2")) == (None, None, "b")
    assert reg.load() == {"b": (4, 1)}
