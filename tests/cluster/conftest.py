"""A real local Ray cluster (``ray.cluster_utils.Cluster``: each node a real raylet on this machine) and real
``execspace serve --ray`` front doors over it, for the official E2B SDK. One cluster at a time (the machine is
shared): each module starts its own and always shuts it down."""

from __future__ import annotations

import contextlib
import gc
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support import until

pytest.importorskip("ray", reason="serve --ray is tested on a local Ray cluster (pip install 'execspace[ray]')")
pytest.importorskip("e2b", reason="serve --ray is tested with the official e2b SDK (pip install 'execspace[dev]')")
pytest.importorskip("starlette", reason="needs the serve extra (pip install 'execspace[serve]')")

from execspace.testing.binding import make_traversable
from execspace.testing.processes import read_until, terminate

API_KEY = "e2b_" + "0123456789abcdef" * 2
#: What Ray's in-process cluster code leaves to the garbage collector (a socket it probed a port with, the Popen of
#: a raylet it killed and did not wait for): not this project's leaks, and collected in whichever test runs then.
RAYS_LEFTOVERS = (
    "ignore:Exception ignored in. <(socket.socket|function Popen.__del__):pytest.PytestUnraisableExceptionWarning"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.filterwarnings(RAYS_LEFTOVERS))


def shut_down(cluster: Any) -> None:
    """Shut a local cluster down and collect what Ray left to the garbage collector now, in a test of this
    directory (where :data:`RAYS_LEFTOVERS` are ignored), not in a later one."""
    try:
        cluster.shutdown()
    finally:
        gc.collect()


#: Each node's sandboxes at most (``--max-sandboxes``, per node in a cluster).
PER_NODE = 4


@dataclass
class FrontDoor:
    url: str
    process: subprocess.Popen[bytes]
    key: str = API_KEY

    def sdk(self) -> dict[str, str]:
        return {"api_url": self.url, "sandbox_url": self.url, "api_key": self.key}


@dataclass
class LocalCluster:
    cluster: Any
    root: Path
    added: list[Any] = field(default_factory=list)
    """The worker nodes, in the order they were added (Ray's own ``worker_nodes`` is a set)."""

    @property
    def ordered(self) -> list[str]:
        """The nodes' ids: the head, then each worker in the order it was added."""
        return [str(self.cluster.head_node.node_id), *(str(n.node_id) for n in self.added)]

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def node_ids(self) -> set[str]:
        return {str(n.node_id) for n in [self.cluster.head_node, *self.cluster.worker_nodes]}

    def workers(self) -> list[Any]:
        return list(self.cluster.worker_nodes)

    @contextlib.contextmanager
    def front_door(
        self,
        key: str = API_KEY,
        *flags: str,
        per_node: int = PER_NODE,
        log: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Iterator[FrontDoor]:
        """``execspace serve --ray`` on a free port, ``per_node`` sandboxes a node (more ``flags`` of serve's),
        stopped with SIGTERM when the block ends; with ``log``, its output (Ray's forwarding of the nodes' logs too)
        goes to that file; ``env``: more variables of its own (not its nodes')."""
        env = {**os.environ, "EXECSPACE_DAEMON": "off", "PYTHONUNBUFFERED": "1", **(env or {})}
        argv = [sys.executable, "-m", "execspace", "serve", "--port", "0", "--api-key", key, "--ray", self.address]
        argv += ["--workspace-root", str(self.root), "--pool-size", "0", "--max-sandboxes", str(per_node)]
        argv += ["--kernel-environment", "none", "--no-warm-kernels", *flags]
        with open(log, "wb") if log is not None else contextlib.nullcontext() as out:
            process = subprocess.Popen(
                argv, stdout=out if out is not None else subprocess.PIPE, stderr=subprocess.STDOUT, env=env
            )
        try:
            if log is not None:
                until(
                    "the front door listens",
                    lambda: b"listening on" in log.read_bytes() or process.poll() is not None,
                    60,
                )
                found = re.search(rb"listening on (\S+)", log.read_bytes())
                seen = log.read_bytes()
            else:
                assert process.stdout is not None
                found, seen = read_until(process.stdout, rb"listening on (\S+)", 60)
            if found is None:
                raise AssertionError(f"execspace serve --ray did not start: {seen.decode(errors='replace')}")
            yield FrontDoor(found.group(1).decode(), process, key)
        finally:
            terminate(process, grace=20)
            if process.stdout is not None:
                process.stdout.close()


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with started_cluster(tmp_path_factory.mktemp("cluster"), {}, [{}, {}]) as cluster:
        yield cluster


@contextlib.contextmanager
def started_cluster(root: Path, head: dict[str, Any], workers: list[dict[str, Any]]) -> Iterator[LocalCluster]:
    """A local cluster of a head and ``workers`` (each its ``add_node`` arguments over one CPU; ``env_vars`` are its
    Ray processes' and so its agent's and node server's), shut down when the block ends, whatever happened."""
    from ray.cluster_utils import Cluster

    def start() -> tuple[Any, list[Any]]:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, **head})
        added = [cluster.add_node(**{"num_cpus": 1, **worker}) for worker in workers]
        cluster.wait_for_nodes()
        return cluster, added

    make_traversable(root)  # as root, each sandbox's own uid must reach its workspace
    cluster, added = ray_start(start)
    try:
        yield LocalCluster(cluster, root, added)
    finally:
        shut_down(cluster)
        until("the node servers are gone", lambda: not node_servers(), within=30)


T = TypeVar("T")

#: Tries of a local cluster's start: a raylet whose agents take over the 15 s Ray gives them ends its node's start
#: (a loaded machine; Ray 2.60 has no setting for it).
_STARTS = 3


def ray_start(start: Callable[[], T]) -> T:
    """``start()`` of a local cluster, tried again where a node timed out during its start; whatever a failed try
    started (a GCS, monitors, a dashboard: this process's new descendants) is ended first, never left to load the
    machine for the next try and the tests after."""
    for attempt in range(_STARTS):
        before = descendants(os.getpid())
        try:
            return start()
        except Exception as exc:
            end(started_since(before))
            if attempt == _STARTS - 1 or "timed out during startup" not in str(exc):
                raise
            print(f"a local Ray cluster did not start ({exc}): trying again", file=sys.stderr)
    raise AssertionError("unreachable")


def started_since(before: dict[int, str]) -> dict[int, str]:
    """The descendants of this process (pid → start time) that were not among ``before``: other fixtures'
    processes (a session's private dockerd, servers) are its children too, and must outlive a cluster."""
    return {pid: since for pid, since in descendants(os.getpid()).items() if before.get(pid) != since}


def end(processes: dict[int, str]) -> None:
    """SIGKILL ``processes`` (pid → start time) that still run (a pid taken by another process since is not)."""
    for pid, since in processes.items():
        if _started_at(pid) == since:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def descendants(pid: int) -> dict[int, str]:
    """Every descendant of ``pid`` now, with its start time (so that a pid reused later is not ended)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            children.setdefault(stat[0], []).append(int(entry))
    found: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        if (stat := _stat(child)) is not None:
            found[child] = stat[1]
            todo += children.get(child, [])
    return found


def _started_at(pid: int) -> str | None:
    stat = _stat(pid)
    return None if stat is None else stat[1]


def _stat(pid: int) -> tuple[int, str] | None:
    """A process's parent and start time (``/proc/PID/stat``), None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[1]), fields[19]


def processes_running(marker: bytes) -> list[int]:
    """Pids of the processes on this host whose command line has ``marker``."""
    return _processes(lambda cmdline: marker in cmdline)


def node_servers() -> list[int]:
    """Pids of the node agents' servers running on this host."""
    return _processes(lambda cmdline: b"execspace.server.cluster.nodeserve" in cmdline)


def servers_on(node_id: str) -> int:
    """How many node servers run on a node of the local cluster: descendants of its raylet (Ray's workers are the
    raylet's children, a node server an agent's child), whatever else runs on this host."""
    parents: dict[int, int] = {}
    raylet = None
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1])
                if f"--node_id={node_id}".encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    raylet = int(entry)

    def below(pid: int) -> bool:
        while pid > 1:
            if (pid := parents.get(pid, 0)) == raylet:
                return True
        return False

    assert raylet is not None, f"no raylet of node {node_id} runs here"
    return sum(1 for pid in node_servers() if below(pid))


def sleepers(seconds: int) -> list[int]:
    """Pids of the ``sleep SECONDS`` programs running on this host: a test's marked programs in its sandboxes."""
    return _processes(lambda cmdline: cmdline == f"sleep\0{seconds}\0".encode())


def _processes(matches: Callable[[bytes], bool]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if matches(Path(f"/proc/{entry}/cmdline").read_bytes()):
                    found.append(int(entry))
    return found


def client_id(door: FrontDoor, sandbox_id: str) -> str:
    """The node of a sandbox, as ``GET /sandboxes/{id}`` reports it (``clientID``)."""
    import httpx

    answer = httpx.get(f"{door.url}/sandboxes/{sandbox_id}", headers={"X-API-KEY": API_KEY}, timeout=30)
    answer.raise_for_status()
    return str(answer.json()["clientID"])
