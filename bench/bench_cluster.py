"""`execspace serve --ray` benchmarks (13): a 3-node local Ray cluster behind a front door against single-host serve.

In one run, with the same server options on both sides (the sandbox backend, no warm kernels; the single host
keeps as many sandboxes ready as the three nodes together): the official E2B SDK's create and create + first
command through the front door against the same on a single-host ``execspace serve``; 200 sandboxes held at once
across the cluster's 3 nodes, each created, written and run (8 at a time), against the same 200 on the single host;
and a 50 MB download through the front door against the same download straight from the node server that holds
the sandbox (its address from the node's agent, over Ray). The cluster is ``ray.cluster_utils.Cluster``: every
node a real raylet on this machine, so the nodes share its cores; what the rows show is the front door's and Ray's
cost, not a cluster's capacity.

``python bench/bench_cluster.py [--quick]`` runs it alone; ``./run bench --only cluster`` as part of the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench_core import Check, Plan, Report, Row, Stats, backend_ready, interleaved, scratch_dir
from bench_serve import KEY, _listening
from execspace.testing.binding import make_traversable

SECTION = "13 cluster"
#: The issue's goal for a create (and a create and its first command) through the cluster against one host.
_OVER_SINGLE = 1.5
#: Sandboxes held at once across the cluster, and how many are being made at a time.
_MANY, _AT_ONCE = 200, 8
_DOWNLOAD = 50 * 1000 * 1000
#: Every local cluster of the machine's tests and benchmarks takes it: two at once would share two cores.
_LOCK = "/tmp/ray-cluster.lock"


@contextlib.contextmanager
def _cluster_lock() -> Iterator[None]:
    with open(_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def _local_cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


#: Sandboxes each node's server keeps ready; the single host keeps as many as the three nodes together.
_POOL = 4


def _serve_argv(root: Path, pool: int, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "execspace", "serve", "--port", "0", "--api-key", KEY, "--workspace-root", str(root)]
    return [*argv, "--pool-size", str(pool), "--kernel-environment", "none", "--no-warm-kernels", *extra]


async def run_cluster(plan: Plan, report: Report, log: Any) -> None:
    if not await backend_ready("sandbox", "13 cluster benchmarks", report, log):
        return
    try:
        import ray  # noqa: F401
        from e2b import Sandbox
    except ImportError:
        report.notes.append("cluster: Ray or the e2b SDK is not installed (pip install 'execspace[dev]'): skipped")
        return
    log("13 cluster (a local 3-node Ray cluster)")
    with (
        _cluster_lock(),
        scratch_dir("execspace-bench-cluster-") as root,
        _local_cluster() as cluster,
    ):
        make_traversable(root)  # as root, each sandbox's own uid must reach its workspace
        (root / "single").mkdir()
        (root / "cluster").mkdir()
        single = _serve_argv(root / "single", 3 * _POOL, "--max-sandboxes", str(_MANY + 50))
        door = _serve_argv(root / "cluster", _POOL, "--max-sandboxes", str(_MANY // 2), "--ray", cluster.address)
        with (
            _listening(single, "execspace serve") as (one_url, _),
            _listening(door, "execspace serve --ray") as (
                door_url,
                _,
            ),
        ):
            await _creates(Sandbox, one_url, door_url, plan, report)
            await _many(Sandbox, one_url, door_url, report, log)
            await _download(Sandbox, door_url, cluster.address, plan, report)


def _sdk(url: str) -> dict[str, str]:
    return {"api_url": url, "sandbox_url": url, "api_key": KEY}


async def _creates(sandbox_cls: Any, one_url: str, door_url: str, plan: Plan, report: Report) -> None:
    made: list[Any] = []

    def create(url: str, run: bool) -> Any:
        async def step() -> None:
            sbx = await asyncio.to_thread(sandbox_cls.create, **_sdk(url))
            made.append(sbx)
            if run:
                await asyncio.to_thread(sbx.commands.run, "true")

        return step

    steps = [create(door_url, False), create(one_url, False), create(door_url, True), create(one_url, True)]
    try:
        door, one, door_run, one_run = await interleaved(steps, plan.serve_iters, plan.warmup // 3)
    finally:  # killed after the timing: a kill between creates would be timed, or refill a pool meanwhile
        for sbx in made:
            await asyncio.to_thread(sbx.kill)
    label = "the same through single-host execspace serve"
    for name, lib, base in (
        ("create → 201 through the cluster (SDK Sandbox.create)", door, one),
        ("create + first commands.run('true') through the cluster", door_run, one_run),
    ):
        row = Row(SECTION, name, "ms", Stats.of(lib, 1000), Stats.of(base, 1000), label)
        row.target = f"median ≤ {_OVER_SINGLE:g}× single host"
        row.passed = row.ratio is not None and row.ratio <= _OVER_SINGLE
        report.rows.append(row)


async def _many(sandbox_cls: Any, one_url: str, door_url: str, report: Report, log: Any) -> None:
    """``_MANY`` sandboxes held at once, each created, given a file and run (``_AT_ONCE`` at a time), through the
    cluster and then on one host: the seconds of each sandbox's three calls, the errors, the nodes used."""
    results: dict[str, tuple[list[float], list[str], Counter[str]]] = {}
    for side, url in (("cluster", door_url), ("single", one_url)):
        log(f"cluster: {_MANY} sandboxes, {side}")
        started = time.perf_counter()
        results[side] = await _hold_many(sandbox_cls, url)
        report.notes.append(f"cluster: {_MANY} sandboxes ({side}) in {time.perf_counter() - started:.1f} s")
    (lib, errors, nodes), (base, base_errors, _) = results["cluster"], results["single"]
    name = f"{_MANY} sandboxes across 3 nodes: create + files.write + commands.run (per sandbox, {_AT_ONCE} at once)"
    report.rows.append(
        Row(SECTION, name, "ms", Stats.of(lib, 1000), Stats.of(base, 1000), f"the same {_MANY} on a single host")
    )
    spread = ", ".join(f"{n[:8]}: {k}" for n, k in sorted(nodes.items()))
    report.checks.append(
        Check(SECTION, f"{_MANY} sandboxes through the cluster: no error, every node used",
              f"{len(errors)} errors ({'; '.join(errors[:3]) or 'none'}); nodes {spread}",
              not errors and len(nodes) == 3)
    )  # fmt: skip
    if base_errors:
        report.notes.append(f"cluster: the single host's {_MANY} had {len(base_errors)} errors: {base_errors[:3]}")


async def _hold_many(sandbox_cls: Any, url: str) -> tuple[list[float], list[str], Counter[str]]:
    gate = asyncio.Semaphore(_AT_ONCE)
    held: list[Any] = []
    errors: list[str] = []
    times: list[float] = []

    async def one(i: int) -> None:
        async with gate:
            t0 = time.perf_counter()
            try:
                sbx = await asyncio.to_thread(sandbox_cls.create, timeout=600, **_sdk(url))
                held.append(sbx)
                await asyncio.to_thread(sbx.files.write, "/home/user/n.txt", str(i))
                out = (await asyncio.to_thread(sbx.commands.run, "cat /home/user/n.txt")).stdout
                if out != str(i):
                    errors.append(f"sandbox {i} read {out!r}")
            except Exception as exc:  # counted: the row's point is that there are none
                errors.append(f"{type(exc).__name__}: {str(exc)[:120]}")
                return
            times.append(time.perf_counter() - t0)

    try:
        await asyncio.gather(*(one(i) for i in range(_MANY)))
        nodes = Counter(await asyncio.to_thread(_client_ids, url, [s.sandbox_id for s in held]))
    finally:
        kills = asyncio.Semaphore(_AT_ONCE)

        async def kill(sbx: Any) -> None:
            async with kills:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(sbx.kill)

        await asyncio.gather(*(kill(s) for s in held))
    return times, errors, nodes


def _client_ids(url: str, sandbox_ids: list[str]) -> list[str]:
    with httpx.Client(base_url=url, headers={"X-API-KEY": KEY}, timeout=30) as http:
        return [str(http.get(f"/sandboxes/{sid}").json().get("clientID")) for sid in sandbox_ids]


async def _download(sandbox_cls: Any, door_url: str, address: str, plan: Plan, report: Report) -> None:
    """A 50 MB file read through the front door (its proxy streams it) and straight from the node's server."""
    sbx = await asyncio.to_thread(sandbox_cls.create, timeout=600, **_sdk(door_url))
    try:
        node = (await asyncio.to_thread(_client_ids, door_url, [sbx.sandbox_id]))[0]
        node_url = _node_server(address, node)  # in the main thread: ray.init sets its signal handlers there
        await asyncio.to_thread(sbx.commands.run, f"head -c {_DOWNLOAD} /dev/urandom > /home/user/big")
        direct = await asyncio.to_thread(sandbox_cls.connect, sbx.sandbox_id, api_url=door_url, sandbox_url=node_url,
                                         api_key=KEY)  # fmt: skip

        def read(through: Any) -> Any:
            async def step() -> None:
                data = await asyncio.to_thread(through.files.read, "/home/user/big", format="bytes")
                if len(data) != _DOWNLOAD:
                    raise RuntimeError(f"read {len(data)} bytes of {_DOWNLOAD}")

            return step

        rounds = max(3, plan.big_rounds)
        lib, base = await interleaved([read(sbx), read(direct)], rounds, 1)
    finally:
        await asyncio.to_thread(sbx.kill)
    report.rows.append(
        Row(SECTION, "files.read of 50 MB through the front door", "ms", Stats.of(lib, 1000), Stats.of(base, 1000),
            "the same read straight from the node's server (the SDK's sandbox_url set to it)")
    )  # fmt: skip


def _node_server(address: str, node_id: str) -> str:
    """The URL of the server of ``node_id``'s agent, asked of the agent over Ray."""
    import ray

    from execspace.server.cluster.nodes import NAMESPACE, agent_name

    ray.init(address=address, namespace=NAMESPACE, logging_level="WARNING")
    try:
        endpoint = ray.get(ray.get_actor(agent_name(node_id)).endpoint.remote(), timeout=30)
        return str(endpoint.url)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    report = Report()
    plan = Plan.quick() if "--quick" in sys.argv else Plan()
    asyncio.run(run_cluster(plan, report, lambda m: print(f"... {m}", file=sys.stderr)))
    for row in report.rows:
        base = f"{row.base.median:.1f}" if row.base else "-"
        ratio = f"{row.ratio:.2f}×" if row.ratio is not None else "-"
        print(f"{row.name}: {row.lib.median:.1f} {row.unit} vs {base} ({ratio}) {row.target} {row.passed}")
    for check in report.checks:
        print(f"[{'ok' if check.passed else 'FAIL'}] {check.name}: {check.value}")
    for note in report.notes + report.failed:
        print("note:", note)
