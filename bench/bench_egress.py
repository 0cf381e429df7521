"""Egress-proxy benchmarks (9): what the allow-list proxy adds to a connection, against the same connection made
directly on loopback in the same run.

The upstream is a separate process (threads: an echo, and an HTTP answer of N zero bytes); the proxy is the
library's :class:`~execspace.process.egress.EgressProxy` in this process, on a loopback listener, with the
upstream's name pinned (``allowed.test``). Set-up: connect, ``CONNECT allowed.test:PORT``, one echoed byte, close
(baseline: connect to the upstream, one echoed byte, close). Download: ``curl`` fetching N bytes through a CONNECT
tunnel (baseline: ``curl`` fetching them directly). Per run: ``/bin/true`` in a sandbox whose network is an
allow-list against one whose network is off (the bridge, the channel and the proxy of each run).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import execspace
from bench_core import MIB, Plan, Report, Row, Stats, backend_ready, interleaved, ok, scratch_dir
from execspace import RunProgramSpec
from execspace.models import NetworkPolicy
from execspace.process.egress import EgressProxy

SECTION = "9 egress"

_UPSTREAM = r"""
import socketserver, sys, time
SIZE = int(sys.argv[1])
RATE = float(sys.argv[2]) * (1 << 20)  # bytes a second (0: as fast as it goes)
BLOCK = memoryview(bytes(1 << 20))
class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        data = self.request.recv(65536)
        if data.startswith(b"GET "):
            self.request.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % SIZE)
            left, start = SIZE, time.monotonic()
            while left:
                n = min(left, len(BLOCK))
                self.request.sendall(BLOCK[:n])
                left -= n
                ahead = RATE and start + (SIZE - left) / RATE - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            return
        while data:
            self.request.sendall(data)
            data = self.request.recv(65536)
class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
server = Server(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@contextlib.contextmanager
def _upstream(size: int, rate: float = 0) -> Iterator[int]:
    """An upstream serving ``size`` bytes per GET, at ``rate`` MiB/s (0: as fast as loopback takes them)."""
    proc = subprocess.Popen([sys.executable, "-c", _UPSTREAM, str(size), str(rate)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


async def _echo_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"x")
    if await reader.readexactly(1) != b"x":
        raise RuntimeError("the echo came back wrong")
    writer.close()
    await writer.wait_closed()


async def _setup(plan: Plan, report: Report, proxy_port: int, port: int) -> None:
    async def through_proxy() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        writer.write(f"CONNECT allowed.test:{port} HTTP/1.1\r\nHost: allowed.test:{port}\r\n\r\n".encode())
        if not (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200"):
            raise RuntimeError("the proxy refused the benchmark's CONNECT")
        await _echo_once(reader, writer)

    async def direct() -> None:
        await _echo_once(*await asyncio.open_connection("127.0.0.1", port))

    lib, base = await interleaved([through_proxy, direct], plan.sandbox_true_iters, plan.warmup)
    row = Row(
        SECTION,
        "connection set-up (CONNECT + 1 byte echo)",
        "ms",
        Stats.of(lib, 1e3),
        Stats.of(base, 1e3),
        "the same connection straight to the upstream",
        target="Δ ≤ 2 ms",
    )
    row.passed = row.delta is not None and row.delta <= 2.0
    report.rows.append(row)


async def _download(
    plan: Plan, report: Report, proxy_port: int, port: int, size: int, *, pace: str = "", reference: bool = True
) -> None:
    curl = shutil.which("curl")
    if curl is None:
        report.notes.append("egress: no curl, download throughput not measured")
        return

    def fetch(*proxy: str) -> Any:
        async def step() -> None:
            proc = await asyncio.create_subprocess_exec(curl, "-sSf", "-o", "/dev/null", *proxy, url)
            ok(await proc.wait(), "curl " + " ".join(proxy))

        return step

    url = f"http://allowed.test:{port}/"
    resolve = ["--resolve", f"allowed.test:{port}:127.0.0.1"]
    tunnel = fetch("--proxytunnel", "-x", f"http://127.0.0.1:{proxy_port}")
    lib, base = await interleaved([tunnel, fetch(*resolve)], plan.big_rounds * 2, 1)
    mib = size / MIB
    row = Row(
        SECTION,
        f"download {mib:.0f} MiB through a CONNECT tunnel{pace}",
        "MiB/s",
        Stats.of([mib / t for t in lib], higher_is_better=True),
        Stats.of([mib / t for t in base], higher_is_better=True),
        "curl straight to the upstream",
        higher_is_better=True,
        target="≥ 80 % of direct",
    )
    row.passed = row.ratio is not None and row.ratio >= 0.8
    report.rows.append(row)
    if reference:
        await _reference_relay(plan, report, port, size, fetch(*resolve))


async def _reference_relay(plan: Plan, report: Report, port: int, size: int, direct: Any) -> None:
    """The same download through socat (a C relay, one process per connection), when it is installed: how much of
    the direct rate any relay in user space keeps on this machine."""
    socat = shutil.which("socat")
    if socat is None:
        return
    with socket.create_server(("127.0.0.1", 0)) as probe:
        relay_port = probe.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        socat, f"TCP-LISTEN:{relay_port},bind=127.0.0.1,fork,reuseaddr", f"TCP:127.0.0.1:{port}"
    )
    try:
        for _ in range(100):  # until it listens
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", relay_port), timeout=1).close()
                break
            await asyncio.sleep(0.02)

        async def relayed() -> None:
            fetch = await asyncio.create_subprocess_exec(
                "curl", "-sSf", "-o", "/dev/null", f"http://127.0.0.1:{relay_port}/"
            )
            ok(await fetch.wait(), "curl through socat")

        lib, base = await interleaved([relayed, direct], plan.big_rounds * 2, 1)
    finally:
        proc.kill()
        await proc.wait()
    mib = size / MIB
    report.rows.append(
        Row(
            SECTION,
            f"reference: download {mib:.0f} MiB through socat",
            "MiB/s",
            Stats.of([mib / t for t in lib], higher_is_better=True),
            Stats.of([mib / t for t in base], higher_is_better=True),
            "curl straight to the upstream",
            higher_is_better=True,
        )
    )


async def _per_run(plan: Plan, report: Report, port: int) -> None:
    with scratch_dir("execspace-bench-egress-") as root:
        async with execspace.open_engine("sandbox", workspace_root=root) as engine:
            if not engine.describe().network_domains:
                report.notes.append("egress: no C compiler, per-run cost not measured")
                return
            ws = await engine.manager.create_workspace("bench/egress")
            allow = NetworkPolicy.allow([f"allowed.test:{port}"], resolve={"allowed.test": "127.0.0.1"})

            def run(network: Any) -> Any:
                async def step() -> None:
                    result = await engine.runner.run_program(ws, RunProgramSpec("/bin/true", network=network))
                    ok(result.exit_code, f"/bin/true with network {network!r} ({result.stderr.strip()})")

                return step

            lib, base = await interleaved([run(allow), run("off")], plan.sandbox_python_iters, 5)
    name, label = "sandbox run of /bin/true with an allow-list", "the same run with the network off"
    report.rows.append(Row(SECTION, name, "ms", Stats.of(lib, 1e3), Stats.of(base, 1e3), label))


#: A 1 Gbit/s link's pace in MiB/s: what a download from beyond this host gets at most, where on loopback both ends
#: are memory copies at ~4 GiB/s and any relay's own copies take a share of the same 2 cores.
LINK_1GBIT = 1e9 / 8 / MIB


async def run_egress(plan: Plan, report: Report, log: Any) -> None:
    log("9 egress proxy")
    size = 256 * MIB if plan.big_rounds >= 5 else 64 * MIB
    with _upstream(size) as port, _upstream(size // 4, LINK_1GBIT) as paced:
        allowed = [f"allowed.test:{port}", f"allowed.test:{paced}"]
        proxy = EgressProxy(NetworkPolicy.allow(allowed, resolve={"allowed.test": "127.0.0.1"}), "bench")
        listener = socket.create_server(("127.0.0.1", 0))
        proxy_port = listener.getsockname()[1]
        await proxy.serve(listener)
        try:
            await _setup(plan, report, proxy_port, port)
            await _download(plan, report, proxy_port, port, size)
            pace = f" at a 1 Gbit/s link's pace ({LINK_1GBIT:,.0f} MiB/s)"
            await _download(plan, report, proxy_port, paced, size // 4, pace=pace, reference=False)
        finally:
            proxy.close()
        if await backend_ready("sandbox", "the egress per-run benchmark", report, log):
            await _per_run(plan, report, port)


if __name__ == "__main__":
    from run_all import main

    sys.exit(main(["--only", "egress", *sys.argv[1:]]))
