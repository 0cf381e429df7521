"""The operations of serve --ray on a local 3-node cluster: the front door's own ``GET /metrics`` (read by
Prometheus's parser) following creates, a full cluster, the traffic it passes on and a node it loses;
``GET /metrics/targets`` listing each node's server, whose own ``/metrics`` answers at the listed address; and
``--audit-log``: every node's server appending to the one file of this machine, each line whole and naming its
node, every action's line there, the front door's own refusal too."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from execspace.audit import key_id
from tests.support import audit_entries, audit_lines, until

from .conftest import API_KEY, FrontDoor, LocalCluster, client_id

prometheus_parser = pytest.importorskip("prometheus_client.parser", reason="needs the serve extra")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
PER_NODE = 2


def scrape(url: str, headers: dict[str, str] | None = None) -> Samples:
    answer = httpx.get(f"{url}/metrics", headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in prometheus_parser.text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str) -> float:
    """The sum of a metric's samples over every label."""
    return sum(v for (n, _), v in samples.items() if n == name)


def targets(door: FrontDoor, headers: dict[str, str] | None = None) -> Any:
    answer = httpx.get(f"{door.url}/metrics/targets", headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    return answer.json()


@pytest.fixture(scope="module")
def audit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("audit") / "audit.jsonl"


@pytest.fixture(scope="module")
def door(local_cluster: LocalCluster, audit: Path) -> Iterator[FrontDoor]:
    """The front door that starts this cluster's agents: their servers audit to ``audit`` (the first front door's
    options are the agents')."""
    with local_cluster.front_door(API_KEY, "--audit-log", str(audit), per_node=PER_NODE) as front:
        yield front


def test_the_front_door_counts_creates_a_full_cluster_and_the_traffic_and_lists_the_nodes_servers(
    local_cluster: LocalCluster, door: FrontDoor, audit: Path
) -> None:
    until(
        "the front door knows the three nodes",
        lambda: value(scrape(door.url), "execspace_frontdoor_nodes", state="alive") == 3,
    )
    until("every node's server is listed", lambda: len(targets(door)) == 3, within=120)
    listed = targets(door)
    assert {group["labels"]["execspace_node"] for group in listed} == local_cluster.node_ids()
    assert all(len(group["targets"]) == 1 for group in listed)
    before = scrape(door.url)
    assert value(before, "execspace_frontdoor_creates_total", outcome="created") == 0

    boxes = [Sandbox.create(timeout=120, **door.sdk()) for _ in range(3 * PER_NODE)]
    try:
        payload = b"x" * 100_000
        for box in boxes:
            box.files.write("/home/user/data.bin", payload)
            assert box.commands.run("wc -c < /home/user/data.bin").stdout.strip() == str(len(payload))
            assert box.files.read("/home/user/data.bin", format="bytes") == payload
        # once, without the SDK (which retries a 429 on its own)
        full = httpx.post(f"{door.url}/sandboxes", json={"templateID": "base"}, headers={"X-API-KEY": API_KEY})
        assert full.status_code == 429
        after = scrape(door.url)
        assert value(after, "execspace_frontdoor_creates_total", outcome="created") == len(boxes)
        assert value(after, "execspace_frontdoor_creates_total", outcome="full") == 1
        assert value(after, "execspace_frontdoor_creates_total", outcome="error") == 0
        assert value(after, "execspace_frontdoor_requests_total", kind="control", code="4xx") >= 1
        for kind in ("control", "rpc", "files"):
            assert value(after, "execspace_frontdoor_requests_total", kind=kind, code="2xx") >= len(boxes), kind
        up = value(after, "execspace_frontdoor_body_bytes_total", direction="up")
        down = value(after, "execspace_frontdoor_body_bytes_total", direction="down")
        assert up >= len(boxes) * len(payload) and down >= len(boxes) * len(payload), (up, down)
        calls = value(after, "execspace_frontdoor_node_call_duration_seconds_count")
        assert calls - value(before, "execspace_frontdoor_node_call_duration_seconds_count") >= len(boxes)
        assert value(after, "execspace_frontdoor_unavailable_total", cause="node") == 0
        until(
            "the registry counts every node's sandboxes",
            lambda: total(scrape(door.url), "execspace_frontdoor_node_sandboxes") == len(boxes),
        )
        slots = scrape(door.url)
        assert {value(slots, "execspace_frontdoor_node_slots", node=n) for n in local_cluster.node_ids()} == {2}
        # each node's own metrics, scraped where the front door lists them, count the sandboxes it made
        made = {}
        for group in targets(door):
            node = scrape(f"http://{group['targets'][0]}")
            made[group["labels"]["execspace_node"]] = value(node, "execspace_sandboxes_created_total", template="base")
        assert made == {n: PER_NODE for n in local_cluster.node_ids()}, made
        # E2B's own /sandboxes/metrics is still the nodes' (a single host's answer), behind the key
        assert httpx.get(f"{door.url}/sandboxes/metrics", timeout=30).status_code == 401
        e2b_metrics = httpx.get(f"{door.url}/sandboxes/metrics", headers={"X-API-KEY": API_KEY}, timeout=30)
        assert e2b_metrics.status_code == 501 and "not implemented" in e2b_metrics.text
    finally:
        for box in boxes:
            box.kill()
    # the front door's own refusal (a node's server may have refused one too, on a count a second old: its line names
    # its node)
    refusals = audit_entries(audit, "policy.refusal", what="capacity", node=None)
    assert [(r["key_id"], r["sandbox"]) for r in refusals] == [(key_id(API_KEY), None)]


def test_every_node_appends_whole_lines_to_the_one_audit_file_of_this_machine(
    local_cluster: LocalCluster, door: FrontDoor, audit: Path
) -> None:
    boxes = [Sandbox.create(timeout=120, **door.sdk()) for _ in range(3 * PER_NODE)]
    try:
        node_of = {b.sandbox_id: client_id(door, b.sandbox_id) for b in boxes}
        assert set(node_of.values()) == local_cluster.node_ids()

        def act(job: tuple[Sandbox, int]) -> None:
            box, n = job
            box.files.write(f"/home/user/f{n}.txt", f"file {n}")
            assert box.commands.run(f"echo {n}").stdout == f"{n}\n"

        with ThreadPoolExecutor(6) as pool:  # the nodes' servers write to the file at once
            list(pool.map(act, [(box, n) for box in boxes for n in range(5)]))
    finally:
        for box in boxes:
            box.kill()
    lines = audit_lines(audit)  # every line whole: each parses
    for sandbox_id, node in node_of.items():
        mine = [line for line in lines if line.get("sandbox") == sandbox_id]
        assert {line["node"] for line in mine} == {node}, sandbox_id
        events = [line["event"] for line in mine]
        assert events.count("sandbox.create") == 1 and events.count("sandbox.kill") == 1, events
        assert events.count("command.start") == 5 and events.count("command.end") == 5, events
        writes = {line["path"] for line in mine if line["event"] == "file.write"}
        assert writes >= {f"/home/user/f{n}.txt" for n in range(5)}, writes


def test_the_metrics_follow_the_key_rule_on_the_front_door(local_cluster: LocalCluster, door: FrontDoor) -> None:
    with local_cluster.front_door(API_KEY, "--metrics", "key", per_node=PER_NODE) as keyed:
        for path in ("/metrics", "/metrics/targets"):
            refused = httpx.get(f"{keyed.url}{path}", timeout=30)
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer", path
        bearer = {"Authorization": f"Bearer {API_KEY}"}
        assert value(scrape(keyed.url, bearer), "execspace_frontdoor_creates_total", outcome="created") == 0
        until("every node's server is listed", lambda: len(targets(keyed, bearer)) == 3, within=120)
    with local_cluster.front_door(API_KEY, "--metrics", "off", per_node=PER_NODE) as off:
        for path in ("/metrics", "/metrics/targets"):
            assert httpx.get(f"{off.url}{path}", headers={"X-API-KEY": API_KEY}, timeout=30).status_code == 404


def test_a_lost_node_is_counted_and_leaves_the_targets(local_cluster: LocalCluster, door: FrontDoor) -> None:
    boxes = [Sandbox.create(timeout=120, **door.sdk()) for _ in range(3)]
    where = {b.sandbox_id: client_id(door, b.sandbox_id) for b in boxes}
    worker = next(w for w in local_cluster.workers() if str(w.node_id) in where.values())
    victim = str(worker.node_id)
    lost = next(b for b in boxes if where[b.sandbox_id] == victim)
    local_cluster.cluster.remove_node(worker, allow_graceful=False)

    def not_found() -> bool:
        """Whether the lost sandbox answers 404: the front door found its node gone (its server's address refuses
        connections once it died with its raylet, or Ray reports the node dead)."""
        url = f"{door.url}/sandboxes/{lost.sandbox_id}"
        return httpx.get(url, headers={"X-API-KEY": API_KEY}, timeout=30).status_code == 404

    until("the front door finds the node gone", not_found, within=60)
    after = scrape(door.url)
    assert value(after, "execspace_frontdoor_node_losses_total") == 1
    assert value(after, "execspace_frontdoor_nodes", state="alive") == 2
    assert victim not in {group["labels"]["execspace_node"] for group in targets(door)}
    for box in boxes:
        if box is not lost:
            box.kill()
