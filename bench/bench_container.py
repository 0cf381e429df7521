"""Container-backend benchmarks (6): the library against the plain docker SDK, on a private dockerd.

A private ``dockerd`` (own data root and socket, as the tests start it) and the offline
test image (empty root, host ``/usr`` and ``/etc`` bound read-only) are set up first, so
nothing depends on a daemon the machine may or may not run.

* First run in a new workspace: ``create_workspace`` + ``run_program("true")`` with the warm
  pool (a started container waiting), against the plain SDK cycle a caller without a pool
  pays: ``containers.create`` (same hardened options) + ``start`` + ``exec_run("true")`` +
  ``remove(force=True)``. Between rounds, untimed, the workspace is removed and the pool
  refilled, so every timed round finds one warm container, as a steady service would. A
  second row shows the same first run with the pool off (``pool_size=0``).
* A run in an existing container: ``run_program("true")`` against ``exec_run("true")`` by
  the SDK on the very same container, interleaved.
* The same run with a network allow-list (as root: the run's listener made in the container's network namespace
  and its egress proxy on the host) against the run with the network off, and a connection set-up through that
  proxy from inside the container (``CONNECT`` to an echo upstream on the host, one byte) against the same
  connection straight to an echo server on the container's own loopback, both timed by the program.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import execspace
from bench_core import Plan, Report, Row, Stats, interleaved, ok, scratch_dir
from execspace import RunProgramSpec
from execspace.backends.container.config import ContainerConfig
from execspace.backends.container.daemon import connect
from execspace.models import NetworkPolicy
from execspace.testing.private_daemon import (
    HOST_USR_BINDS,
    DaemonUnavailable,
    PrivateDaemon,
    import_host_usr_image,
    start_private_daemon,
)
from execspace.workspace.layout import ensure_layout
from execspace.workspace.protected import Placeholders

SECTION = "6 container"
TRUE = RunProgramSpec("true")


async def _alternating(
    lib: Callable[[], Awaitable[None]],
    base: Callable[[], Awaitable[None]],
    n: int,
    between: Callable[[], Awaitable[None]],
) -> tuple[list[float], list[float]]:
    """Time ``lib`` and ``base`` once per round, order alternating, with untimed ``between`` after each."""
    lib_t: list[float] = []
    base_t: list[float] = []
    for i in range(n):
        for step, out in ((lib, lib_t), (base, base_t)) if i % 2 == 0 else ((base, base_t), (lib, lib_t)):
            t0 = time.perf_counter()
            await step()
            out.append(time.perf_counter() - t0)
            await between()
    return lib_t, base_t


class PlainCycle:
    """What a caller does without a pool: create a hardened container, start it, exec, remove it."""

    def __init__(self, client: Any, image: str, root: Path) -> None:
        self.client, self.root = client, root
        self.config = ContainerConfig(image=image, read_only_binds=HOST_USR_BINDS)
        self.placeholders = Placeholders()
        self.n = 0

    def cycle(self) -> None:
        self.n += 1
        ws = self.root / f"plain-{self.n}"
        ws.mkdir()
        ensure_layout(ws)  # the hardened mounts bind its layout directories
        held = self.placeholders.run()
        try:
            kwargs = self.config.create_kwargs(ws, f"bench-plain-{self.n}-{time.monotonic_ns()}", {"bench": "1"}, held)
            container = self.client.containers.create(kwargs.pop("image"), **kwargs)
            try:
                container.start()
                ok(container.exec_run(["true"], user="65534:65534").exit_code, "plain exec_run true")
            finally:
                container.remove(force=True)
        finally:
            held.release()


async def _first_run(
    engine: execspace.BaseEngine, plain: PlainCycle, n: int, report: Report, label: str, target: bool
) -> None:
    pool = engine.pool
    made: list[execspace.Workspace] = []

    async def lib() -> None:
        ws = await engine.manager.create_workspace(f"bench/first-{len(made)}")
        made.append(ws)
        ok((await engine.runner.run_program(ws, TRUE)).exit_code, "first run true")

    async def base() -> None:
        await asyncio.to_thread(plain.cycle)

    async def between() -> None:
        while made:
            await engine.manager.cleanup(made.pop())
        await pool.ready()

    await between()
    lib_t, base_t = await _alternating(lib, base, n, between)
    report.rows.append(
        Row(
            SECTION,
            label,
            "ms",
            Stats.of(lib_t, 1e3),
            Stats.of(base_t, 1e3),
            "SDK create+start+exec+remove",
            target="≤ 100 ms" if target else "",
            passed=Stats.of(lib_t, 1e3).median <= 100 if target else None,
        )
    )


async def _existing(engine: execspace.BaseEngine, client: Any, plan: Plan, report: Report) -> None:
    ws = await engine.manager.create_workspace("bench/existing")
    host = await engine.runner.run_program(ws, RunProgramSpec("hostname"))
    container = client.containers.get(host.stdout.strip())  # the daemon names the host after the container

    async def lib() -> None:
        ok((await engine.runner.run_program(ws, TRUE)).exit_code, "run true")

    async def base() -> None:
        result = await asyncio.to_thread(container.exec_run, ["true"], user="65534:65534")
        ok(result.exit_code, "exec_run true")

    iters = max(plan.sandbox_true_iters // 4, 10)
    lib_t, base_t = await interleaved([lib, base], iters, max(plan.warmup // 3, 3))
    lib_ms = Stats.of(lib_t, 1e3)
    report.rows.append(
        Row(
            SECTION,
            "run true in an existing container",
            "ms",
            lib_ms,
            Stats.of(base_t, 1e3),
            "SDK exec_run on the same container",
            target="≤ 60 ms",
            passed=lib_ms.median <= 60,
        )
    )


_SETUP_TIMES = r"""
import json, os, socket, sys, threading, time
n, up = int(sys.argv[1]), int(sys.argv[2])
proxy = os.environ["HTTP_PROXY"].rsplit(":", 1)
echo = socket.create_server(("127.0.0.1", 0))
def serve():
    while True:
        c, _ = echo.accept()
        c.sendall(c.recv(1))
        c.close()
threading.Thread(target=serve, daemon=True).start()
def once(tunnel):
    t0 = time.perf_counter()
    if tunnel:
        s = socket.create_connection(("127.0.0.1", int(proxy[1])))
        s.sendall(b"CONNECT allowed.test:%d HTTP/1.1\r\n\r\n" % up)
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += s.recv(1)
        assert head.startswith(b"HTTP/1.1 200"), head
    else:
        s = socket.create_connection(echo.getsockname())
    s.sendall(b"x")
    assert s.recv(1) == b"x"
    s.close()
    return time.perf_counter() - t0
times = {"proxy": [], "direct": []}
for i in range(n):
    for key in (("proxy", "direct") if i % 2 == 0 else ("direct", "proxy")):
        times[key].append(once(key == "proxy"))
print(json.dumps(times))
"""


def _echo_upstream() -> socket.socket:
    """An echo server on the host's loopback (one byte per connection): the proxy's destination."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with server:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                with conn:
                    conn.sendall(conn.recv(1))

    threading.Thread(target=serve, daemon=True).start()
    return server


async def _egress(engine: execspace.BaseEngine, plan: Plan, report: Report) -> None:
    if not engine.describe().network_domains:
        report.notes.append("container egress: not root (or no local daemon), allow-list rows not measured")
        return
    ws = await engine.manager.create_workspace("bench/egress")
    upstream = _echo_upstream()
    port = upstream.getsockname()[1]
    allow = NetworkPolicy.allow([f"allowed.test:{port}"], resolve={"allowed.test": "127.0.0.1"})
    try:

        def run(network: Any) -> Callable[[], Awaitable[None]]:
            async def step() -> None:
                result = await engine.runner.run_program(ws, RunProgramSpec("true", network=network))
                ok(result.exit_code, f"true with network {network!r} ({result.stderr.strip()})")

            return step

        iters = max(plan.sandbox_true_iters // 4, 10)
        lib_t, base_t = await interleaved([run(allow), run("off")], iters, max(plan.warmup // 3, 3))
        name, label = "run true with an allow-list (egress proxy)", "the same run with the network off"
        report.rows.append(Row(SECTION, name, "ms", Stats.of(lib_t, 1e3), Stats.of(base_t, 1e3), label))
        n = str(max(plan.sandbox_true_iters, 20))
        spec = RunProgramSpec("python3", ["-c", _SETUP_TIMES, n, str(port)], network=allow, timeout=120)
        result = await engine.runner.run_program(ws, spec)
        ok(result.exit_code, f"connection set-up from the container ({result.stderr.strip()})")
        times = json.loads(result.stdout)
        row = Row(
            SECTION,
            "connection set-up from the container through its proxy (CONNECT + 1 byte echo)",
            "ms",
            Stats.of(times["proxy"], 1e3),
            Stats.of(times["direct"], 1e3),
            "the same echo on the container's own loopback",
            target="Δ ≤ 2 ms",
        )
        row.passed = row.delta is not None and row.delta <= 2.0
        report.rows.append(row)
    finally:
        upstream.close()


async def run_container(plan: Plan, report: Report, log: Any) -> None:
    try:
        import docker  # type: ignore[import-untyped]  # noqa: F401  # only to say why when it is missing
    except ImportError:
        report.notes.append("container benchmarks skipped: the docker SDK is not installed")
        return
    try:
        daemon = start_private_daemon("docker")
    except DaemonUnavailable as exc:
        report.notes.append(f"container benchmarks skipped: {exc}")
        log(f"6 container: skipped ({exc})")
        return
    log("6 container (private dockerd)")
    try:
        await _run_on(daemon, plan, report)
    finally:
        daemon.stop()


async def _run_on(daemon: PrivateDaemon, plan: Plan, report: Report) -> None:
    client = connect(daemon.host)
    rounds = max(plan.sandbox_rounds * 2, 6)
    try:
        image = import_host_usr_image(client)
        with scratch_dir("execspace-bench-container-") as root:
            plain = PlainCycle(client, image, root / "plain")
            plain.root.mkdir()
            common: dict[str, Any] = {"image": image, "docker_host": daemon.host, "read_only_binds": HOST_USR_BINDS}
            async with execspace.open_engine("container", workspace_root=root / "ws", pool_size=1, **common) as eng:
                await _first_run(eng, plain, rounds, report, "first run in a new workspace (warm pool)", True)
                await _existing(eng, client, plan, report)
                await _egress(eng, plan, report)
            async with execspace.open_engine("container", workspace_root=root / "cold", pool_size=0, **common) as eng:
                label = "first run in a new workspace (pool off)"
                await _first_run(eng, plain, max(rounds // 2, 3), report, label, False)
    finally:
        client.close()
