"""Environments on every node, with the official SDK through a front door: a template's environment is built on a
node the first time a sandbox of it lands there (in that node's own store, each step in the front door's log
naming the node; the front door's own line for the create it answered 503), concurrent creates build it once per
node, a failed build fails its create naming the node and its log and a later create builds again, and
``execspace env build --ray`` builds ahead on every node, exiting 1 naming a node that failed. Each node has its
own store (``EXECSPACE_ENVIRONMENTS`` of its Ray processes) and its own directory of wheels (``PIP_FIND_LINKS``, no
index): builds take seconds and need no registry."""

from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2b import Sandbox, SandboxException
from e2b.exceptions import ServiceBusyException

from tests.support import create_when_built, write_wheel

from .conftest import FrontDoor, LocalCluster, client_id, started_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CONFIG = """
[templates.tiny]
environment = "tiny"
[environments.tiny]
requirements = ["tinyenvpkg"]

[templates.twin]
environment = "twin"
[environments.twin]
requirements = ["tinyenvpkg"]

[templates.flaky]
environment = "flaky"
[environments.flaky]
requirements = ["flakyenvpkg"]
"""
PROBE = "python -c 'import tinyenvpkg, sys; print(tinyenvpkg.VALUE, sys.prefix)'"


@dataclass
class Nodes:
    cluster: LocalCluster
    root: Path
    door: FrontDoor
    log: Path

    def index(self, node_id: str) -> int:
        """Node ``node_id``'s number: 0 the head, then the workers in order (as :attr:`LocalCluster.ordered` has
        them)."""
        return self.cluster.ordered.index(node_id)

    def store(self, i: int) -> Path:
        return self.root / f"store-{i}"

    def wheels(self, i: int) -> Path:
        return self.root / f"wheels-{i}"

    def trees(self, i: int) -> list[str]:
        """The complete environment trees in node ``i``'s store."""
        store = self.store(i)
        return sorted(p.name for p in store.iterdir() if not p.name.startswith(".")) if store.exists() else []

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    root = tmp_path_factory.mktemp("envcluster")
    for i in range(3):
        for name in (f"store-{i}", f"wheels-{i}"):
            (root / name).mkdir(mode=0o755)
    (root / "serve.toml").write_text(CONFIG)

    def node_env(i: int) -> dict[str, str]:
        return {
            "EXECSPACE_ENVIRONMENTS": str(root / f"store-{i}"),
            "PIP_FIND_LINKS": str(root / f"wheels-{i}"),
            "PIP_NO_INDEX": "1",
        }

    head, *workers = ({"env_vars": node_env(i)} for i in range(3))
    with started_cluster(root, head, workers) as cluster:
        log = root / "front-door.log"
        # a create waits 1 s for a build, then 503: the SDK's own retries (after Retry-After) get the sandbox
        flags = ("--config", str(root / "serve.toml"), "--build-wait", "1")
        with cluster.front_door(*("e2b_" + "0123456789abcdef" * 2, *flags), log=log) as door:
            yield Nodes(cluster, root, door, log)


def test_the_first_create_on_a_node_builds_there_and_the_log_names_the_node(nodes: Nodes) -> None:
    for i in range(3):
        write_wheel(nodes.wheels(i), "tinyenvpkg")
    with pytest.raises(ServiceBusyException) as busy:  # the SDK's retries off: the answer while it builds
        Sandbox.create(template="tiny", retries=0, **nodes.door.sdk())
    node = re.search(r"being built on node ([0-9a-f]+) \(", str(busy.value))
    assert node is not None and "its log: " in str(busy.value), str(busy.value)
    box = create_when_built("tiny", **nodes.door.sdk())  # the SDK retries after Retry-After, then we do
    try:
        there = client_id(nodes.door, box.sandbox_id)
        i = nodes.index(there)
        value, prefix = box.commands.run(PROBE).stdout.split()
        assert value == "42" and Path(prefix).parent == nodes.store(i), (prefix, i)
    finally:
        box.kill()
    assert [t for t in nodes.trees(i) if t.startswith("tiny-")] == [Path(prefix).name]
    output = nodes.output()
    said = f"a create on node {node.group(1)}: 503 environment 'tiny' is being built on node {node.group(1)} ("
    assert said in output, output  # the front door's own line: any front door's operator sees it
    for step in ("python", "venv", "pip", "compile", "publish"):
        assert re.search(rf"environment tiny on node {there} \(\S+\): \[ *[\d.]+s\] {step}: ", output), (step, output)


def test_concurrent_creates_build_once_per_node(nodes: Nodes) -> None:
    for i in range(3):
        write_wheel(nodes.wheels(i), "tinyenvpkg")
    with concurrent.futures.ThreadPoolExecutor(6) as pool:  # twin: built on no node yet
        boxes = list(pool.map(lambda _: create_when_built("twin", **nodes.door.sdk()), range(6)))
    try:
        where = {client_id(nodes.door, b.sandbox_id) for b in boxes}
        for box in boxes:
            assert box.commands.run(PROBE).stdout.split()[0] == "42"
    finally:
        for box in boxes:
            box.kill()
    for node_id in where:
        i = nodes.index(node_id)
        assert len([t for t in nodes.trees(i) if t.startswith("twin-")]) == 1
        log = (nodes.store(i) / ".logs" / "twin.log").read_text()
        assert log.count("=== build of twin") == 1 and log.count("publish: ") == 1, log
        assert nodes.output().count(f"building environment twin on node {node_id} (") == 1


def test_a_failed_build_fails_its_create_naming_the_node_and_a_later_create_builds_again(nodes: Nodes) -> None:
    with pytest.raises(SandboxException) as failed:  # no node has flakyenvpkg yet: pip finds nothing
        create_when_built("flaky", **nodes.door.sdk())
    message = str(failed.value)
    node = re.search(r"environment 'flaky' could not be built on node ([0-9a-f]+) \(\S+\) \(its log: (\S+)\)", message)
    assert message.startswith("500: ") and node is not None and "flakyenvpkg" in message, message
    i = nodes.index(node.group(1))
    assert Path(node.group(2)) == nodes.store(i) / ".logs" / "flaky.log"
    assert "=== failed" in Path(node.group(2)).read_text()
    assert not any(t.startswith("flaky-") for t in nodes.trees(i))
    for j in range(3):
        write_wheel(nodes.wheels(j), "flakyenvpkg")
    box = create_when_built("flaky", **nodes.door.sdk())
    try:
        j = nodes.index(client_id(nodes.door, box.sandbox_id))
        assert box.commands.run("python -c 'import flakyenvpkg; print(flakyenvpkg.VALUE)'").stdout == "42\n"
    finally:
        box.kill()
    assert any(t.startswith("flaky-") for t in nodes.trees(j))


def test_env_build_ray_builds_on_every_node_and_names_the_node_that_failed(nodes: Nodes, tmp_path: Path) -> None:
    spec = tmp_path / "ahead.toml"
    spec.write_text('name = "ahead"\nrequirements = ["aheadenvpkg"]\n')
    for i in (0, 1):  # node 2 has no wheel: its build fails
        write_wheel(nodes.wheels(i), "aheadenvpkg")
    argv = [sys.executable, "-m", "execspace", "env", "build", str(spec), "--ray", nodes.cluster.address]
    env = {**os.environ, "EXECSPACE_DAEMON": "off"}
    run = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)
    ids = nodes.cluster.ordered
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert f"FAILED on node {ids[2]} (" in run.stderr and "aheadenvpkg" in run.stderr, run.stderr
    for i in (0, 1):
        assert any(t.startswith("ahead-") for t in nodes.trees(i)), (i, run.stdout, run.stderr)
        assert re.search(rf"node {ids[i]} \(\S+\): pip: pip install aheadenvpkg", run.stderr), run.stderr
        assert f"built on node {ids[i]} (" in run.stdout
    assert not any(t.startswith("ahead-") for t in nodes.trees(2))
    write_wheel(nodes.wheels(2), "aheadenvpkg")
    again = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)
    assert again.returncode == 0, (again.stdout, again.stderr)
    assert all(any(t.startswith("ahead-") for t in nodes.trees(i)) for i in range(3)), again.stderr
    assert len(re.findall(r"cached: already built", again.stderr)) == 2, again.stderr
