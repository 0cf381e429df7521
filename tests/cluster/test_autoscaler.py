"""Ray's own autoscaler grows the cluster when every node is full: creates through a front door fill the head, the
next is answered 429 with ``Retry-After`` at once, the autoscaler adds a node of the type that declares
``execspace_sandbox`` slots, and a create then lands on it.

The autoscaler is Ray's real one (its monitor process, the v1 autoscaler) over its fake multi-node provider, which
starts each new node as real raylets on this machine: what ``ray.cluster_utils.AutoscalingCluster`` runs. That class
itself cannot be used here: Ray 2.60's wheel lacks the ``fake_multi_node/example.yaml`` it builds its configuration
from (``FileNotFoundError``), and its ``start`` and ``shutdown`` run ``ray stop --force``, which kills every Ray
process on the machine, other users' clusters too. So the head is started with the same configuration and
environment through ``ray.cluster_utils.Cluster``, and only the processes it started are ended."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from .conftest import (
    API_KEY,
    FrontDoor,
    LocalCluster,
    client_id,
    descendants,
    end,
    node_servers,
    ray_start,
    sleepers,
    started_since,
    until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SLOT = "execspace_sandbox"
#: The head's node id under the fake provider: ``ray start --head`` gives it this id when ``RAY_FAKE_CLUSTER`` is set
#: (ray/autoscaler/_private/fake_multi_node/node_provider.py, FAKE_HEAD_NODE_ID), so that the provider knows it.
FAKE_HEAD_NODE_ID = "fffffffffffffffffffffffffffffffffffffffffffffffffff00000"
#: Seconds a node holds nothing before the autoscaler ends it.
IDLE_SECONDS = 6


def _config(gcs: str, head_slots: int, worker_slots: int) -> dict[str, object]:
    """An autoscaling configuration for the fake provider (the keys of Ray's fake_multi_node/example.yaml): a head of
    ``head_slots`` and at most one worker node of ``worker_slots``, none at first."""
    return {
        "cluster_name": "execspace-autoscaling",
        "max_workers": 1,
        "provider": {
            "type": "fake_multinode",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "gcs_address": gcs,
        },
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 1, SLOT: head_slots}, "node_config": {}, "max_workers": 0},
            "sandboxes": {
                "resources": {"CPU": 1, SLOT: worker_slots},
                "node_config": {},
                "min_workers": 0,
                "max_workers": 1,
            },
        },
        "head_node_type": "ray.head.default",
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": IDLE_SECONDS / 60,
        "auth": {},
        "docker": {},
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


@pytest.fixture(scope="module")
def autoscaling_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    from ray.cluster_utils import Cluster
    from ray.util import get_node_ip_address

    from execspace.testing.binding import make_traversable

    root = tmp_path_factory.mktemp("cluster")
    make_traversable(root)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    config = root / "autoscaling.json"
    config.write_text(json.dumps(_config(f"{get_node_ip_address()}:{port}", head_slots=2, worker_slots=3)))
    head = {
        "num_cpus": 1,
        "resources": {SLOT: 2},
        "autoscaling_config": str(config),
        "gcs_server_port": port,
        "env_vars": {"RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID},
    }
    before = descendants(os.getpid())
    # the monitor (a child of the head) reads these; the nodes it starts are its children
    with _environment(RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1"):
        cluster = ray_start(lambda: Cluster(initialize_head=True, head_node_args=head))
    try:
        yield LocalCluster(cluster, root)
    finally:
        # the nodes the autoscaler started outlive its monitor: ended by pid, those this cluster's start made only
        started = started_since(before)
        cluster.shutdown()
        end(started)
        until("the node servers are gone", lambda: not node_servers(), within=30)


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _raylet_of(node_id: str) -> bool:
    """Whether the raylet of ``node_id`` runs on this host."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if f"--node_id={node_id}".encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    return True
    return False


def _end_agent(cluster: LocalCluster, node_id: str) -> None:
    """``ray.kill`` of a node's agent, as docs/cluster.md says to let the autoscaler end a node."""
    code = (
        f"import ray; ray.init(address={cluster.address!r}, namespace='execspace', logging_level='ERROR'); "
        f"ray.kill(ray.get_actor('execspace-agent-{node_id}'))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _create(door: FrontDoor) -> httpx.Response:
    return httpx.post(f"{door.url}/sandboxes", json={"templateID": "base"}, headers={"X-API-KEY": API_KEY}, timeout=120)


def test_a_full_cluster_grows_by_the_autoscaler_and_the_next_create_lands_on_the_new_node(
    autoscaling_cluster: LocalCluster,
) -> None:
    with autoscaling_cluster.front_door() as door:
        boxes = [Sandbox.create(timeout=300, **door.sdk()) for _ in range(2)]
        try:
            assert {client_id(door, b.sandbox_id) for b in boxes} == {FAKE_HEAD_NODE_ID}
            started = time.monotonic()
            refused = _create(door)
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1", refused.text
            assert time.monotonic() - started < 1.0  # never held while the cluster grows
            deadline = started + 120
            while (answer := _create(door)).status_code == 429 and time.monotonic() < deadline:
                time.sleep(float(answer.headers["retry-after"]))
            grown = time.monotonic() - started
            assert answer.status_code == 201, (answer.status_code, answer.text, grown)
            print(f"the autoscaler's node took its first sandbox {grown:.1f}s after the first 429")
            new = Sandbox.connect(answer.json()["sandboxID"], **door.sdk())
            boxes.append(new)
            node = client_id(door, new.sandbox_id)
            assert node != FAKE_HEAD_NODE_ID and _raylet_of(node)
            new.commands.run("sleep 86397", background=True)
            until("the new node's sandbox runs its marked program", lambda: sleepers(86397))
            # the node's agent (an actor) is work to the autoscaler: the node is not ended as idle under its sandboxes
            kept_until = time.monotonic() + 3 * IDLE_SECONDS
            while time.monotonic() < kept_until:
                assert _raylet_of(node) and sleepers(86397)
                time.sleep(0.5)
            assert new.commands.run("echo still").stdout == "still\n"
            # its agent ended, the node is idle; the request withdrawn (it asked for more than the head's slots), the
            # autoscaler ends it
            new.kill()
            _end_agent(autoscaling_cluster, node)
            until("the autoscaler ended the emptied node", lambda: not _raylet_of(node), within=60)
        finally:
            for box in boxes:
                with contextlib.suppress(Exception):
                    box.kill()
