"""Credential-injection benchmarks (14): HTTPS through the egress proxy to a host with an injection rule (the proxy
ends the client's TLS with the run's CA, reads each request, adds the header and opens its own TLS to the upstream)
against the same HTTPS through the plain tunnel of a host without one, in the same run.

The upstream is a separate process (threads) speaking TLS with a throwaway CA's certificate for ``inject.test`` and
``tunnel.test`` (both pinned to 127.0.0.1); the proxy is the library's :class:`~execspace.process.egress.EgressProxy`
in this process on a loopback listener, verifying the upstream against that CA (``upstream_ca``). The client is
``curl`` through the proxy (``-x``, which tunnels HTTPS with CONNECT), trusting both CAs: one small GET per process
(connection, both handshakes, one request), and a download of N bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench_core import MIB, Plan, Report, Row, Stats, interleaved, ok, scratch_dir
from execspace.models import HeaderInjection, NetworkPolicy, Secret
from execspace.process.egress import EgressProxy

SECTION = "14 egress injection"

_UPSTREAM = r"""
import socketserver, ssl, sys
SIZE = int(sys.argv[1])
BLOCK = memoryview(bytes(1 << 20))
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[2])
class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        line = self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b""):
            pass
        size = SIZE if b" /big " in line else 2
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size)
        left = size
        while left:
            n = min(left, len(BLOCK))
            self.wfile.write(BLOCK[:n])
            left -= n
class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    def get_request(self):
        sock, addr = super().get_request()
        return context.wrap_socket(sock, server_side=True), addr
server = Server(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@contextlib.contextmanager
def _upstream(size: int, chain: Path) -> Iterator[int]:
    """A TLS upstream answering ``/big`` with ``size`` bytes and anything else with two, its certificate ``chain``."""
    proc = subprocess.Popen([sys.executable, "-c", _UPSTREAM, str(size), str(chain)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


def _curl(curl: str, proxy_port: int, bundle: Path, url: str) -> Any:
    async def step() -> None:
        proc = await asyncio.create_subprocess_exec(
            curl, "-sSf", "-o", "/dev/null", "--cacert", str(bundle), "-x", f"http://127.0.0.1:{proxy_port}", url
        )
        ok(await proc.wait(), f"curl {url}")

    return step


async def run_inject(plan: Plan, report: Report, log: Any) -> None:
    log("12 egress injection")
    curl = shutil.which("curl")
    try:
        import trustme
    except ImportError:
        report.notes.append("egress injection skipped: trustme (the dev extra) makes the upstream's certificate")
        return
    if curl is None:
        report.notes.append("egress injection skipped: no curl")
        return
    size = 64 * MIB if plan.big_rounds >= 5 else 16 * MIB
    with scratch_dir("execspace-bench-inject-") as tmp:
        ca = trustme.CA()
        chain = tmp / "upstream.pem"
        ca.issue_cert("inject.test", "tunnel.test").private_key_and_cert_chain_pem.write_to_path(str(chain))
        ca.cert_pem.write_to_path(str(tmp / "upstream-ca.pem"))
        with _upstream(size, chain) as port:
            policy = NetworkPolicy.allow(
                [f"inject.test:{port}", f"tunnel.test:{port}"],
                resolve={"inject.test": "127.0.0.1", "tunnel.test": "127.0.0.1"},
                inject=[HeaderInjection("inject.test", "Authorization", Secret("Bearer bench"))],
                upstream_ca=tmp / "upstream-ca.pem",
            )
            proxy = EgressProxy(policy, "bench")
            assert proxy.ca is not None
            bundle = tmp / "bundle.pem"
            bundle.write_bytes(ca.cert_pem.bytes() + proxy.ca.cert_pem)
            listener = socket.create_server(("127.0.0.1", 0))
            await proxy.serve(listener)
            try:
                await _compare(plan, report, curl, listener.getsockname()[1], bundle, port, size)
            finally:
                proxy.close()


async def _compare(plan: Plan, report: Report, curl: str, proxy_port: int, bundle: Path, port: int, size: int) -> None:
    def fetch(host: str, path: str) -> Any:
        return _curl(curl, proxy_port, bundle, f"https://{host}:{port}{path}")

    small = await interleaved([fetch("inject.test", "/"), fetch("tunnel.test", "/")], plan.cli_iters * 4, 3)
    row = Row(
        SECTION,
        "HTTPS GET through the proxy, TLS ended and header injected (curl: connect, handshakes, 1 request)",
        "ms",
        Stats.of(small[0], 1e3),
        Stats.of(small[1], 1e3),
        "the same GET to a host without a rule (plain tunnel)",
        target="Δ ≤ 10 ms",
    )
    row.passed = row.delta is not None and row.delta <= 10.0
    report.rows.append(row)
    big = await interleaved([fetch("inject.test", "/big"), fetch("tunnel.test", "/big")], plan.big_rounds, 1)
    mib = size / MIB
    row = Row(
        SECTION,
        f"HTTPS download {mib:.0f} MiB through the proxy, TLS ended and re-encrypted",
        "MiB/s",
        Stats.of([mib / t for t in big[0]], higher_is_better=True),
        Stats.of([mib / t for t in big[1]], higher_is_better=True),
        "the same download through the plain tunnel",
        higher_is_better=True,
        target="≥ 40 % of the tunnel",
    )
    row.passed = row.ratio is not None and row.ratio >= 0.4
    report.rows.append(row)


if __name__ == "__main__":
    from run_all import main

    sys.exit(main(["--only", "inject", *sys.argv[1:]]))
