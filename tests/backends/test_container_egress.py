"""Runs whose network is a NetworkPolicy on the real container backend: the container has no network
(``network_mode=none``) and its only way out is the run's egress proxy on the host, listening on a port of the
container's own loopback. Upstream servers run on the host's loopback and are named through the policy's resolver
pins (``allowed.test``, ``denied.test``); the container's loopback is its own, so only the proxy reaches them."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import execspace
from execspace import RunProgramSpec
from execspace.backends.container.egress import egress_unavailable
from execspace.errors import CapabilityError
from execspace.models import NetworkAttempt, NetworkPolicy, RunResult
from tests.backends.container_support import container_engine
from tests.backends.docker_fixture import Daemon
from tests.support import ATTEMPTS, audit_file, served_directory

pytestmark = pytest.mark.timeout(180)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="allow-lists on the container backend need root")

HELLO = "hello from upstream\n"


@dataclass
class Upstream:
    port: int
    requests: list[str]


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    """An HTTP server on the host's loopback serving ``/hello.txt``; ``requests`` lists what reached it."""
    root = tmp_path_factory.mktemp("upstream")
    (root / "hello.txt").write_text(HELLO)
    with served_directory(root) as (port, requests):
        yield Upstream(port, requests)


def _policy(up: Upstream) -> NetworkPolicy:
    return NetworkPolicy.allow(
        [f"allowed.test:{up.port}", f"denied.test:{up.port}", f"localhost:{up.port}"],
        deny=["denied.test"],
        resolve={"allowed.test": "127.0.0.1", "denied.test": "127.0.0.1"},
    )


Box = tuple[execspace.BaseEngine, execspace.Workspace]


@pytest.fixture
async def box(docker_daemon: Daemon, test_image: str, tmp_path: Path) -> AsyncIterator[Box]:
    async with container_engine(docker_daemon, test_image, tmp_path / "ws", pool_size=0) as engine:
        assert engine.describe().network_domains
        yield engine, await engine.manager.create_workspace("egress/ct")


async def run(box: Box, up: Upstream, cmd: str, *args: str) -> RunResult:
    engine, ws = box
    spec = RunProgramSpec(cmd, list(args), network=_policy(up), timeout=60)
    return await engine.runner.run_program(ws, spec)


@as_root
async def test_connect_and_plain_http_reach_an_allowed_name(box: Box, upstream: Upstream) -> None:
    url = f"http://allowed.test:{upstream.port}/hello.txt"
    r = await run(box, upstream, "curl", "-sSf", "-m", "20", "--proxytunnel", url)
    assert (r.exit_code, r.stdout) == (0, HELLO), r.stderr
    (attempt,) = r.network_audit
    assert (attempt.host, attempt.protocol, attempt.allowed, attempt.address) == (
        "allowed.test",
        "connect",
        True,
        "127.0.0.1",
    )
    assert attempt.bytes_down > len(HELLO) and attempt.bytes_up > 0
    assert audit_file(box[1], r) == [attempt.as_dict()]
    r = await run(box, upstream, "python3", "-c", f"import urllib.request as u; print(u.urlopen({url!r}).read())")
    assert r.exit_code == 0 and "hello from upstream" in r.stdout, r.stderr
    assert [(a.protocol, a.method, a.allowed) for a in r.network_audit] == [("http", "GET", True)]
    assert audit_file(box[1], r) == [a.as_dict() for a in r.network_audit]
    # ALL_PROXY is socks5h://: curl sends the name, the proxy resolves it
    r = await run(box, upstream, "sh", "-c", f'curl -sSf -m 20 -x "$ALL_PROXY" {url}')
    assert (r.exit_code, r.stdout) == (0, HELLO), r.stderr
    assert [(a.protocol, a.host, a.allowed) for a in r.network_audit] == [("socks5", "allowed.test", True)]


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("denied.test:{port}", "denied by 'denied.test'"),
        ("nowhere.test:{port}", "not on the allow-list"),
        ("127.0.0.1:{port}", "address 127.0.0.1 is not on the allow-list"),
        ("localhost:{port}", "not a public address"),
    ],
)
@as_root
async def test_refused_destinations_fail_and_are_audited(
    box: Box, upstream: Upstream, target: str, reason: str
) -> None:
    before = len(upstream.requests)
    url = "http://" + target.format(port=upstream.port) + "/hello.txt"
    for flags in (["--proxytunnel"], []):  # CONNECT, plain HTTP
        r = await run(box, upstream, "curl", "-sSf", "-m", "20", *flags, url)
        assert r.exit_code != 0 and HELLO not in r.stdout
        (attempt,) = r.network_audit
        assert not attempt.allowed and reason in attempt.reason, attempt
        assert audit_file(box[1], r) == [attempt.as_dict()]
    assert len(upstream.requests) == before


@as_root
async def test_dns_and_direct_sockets_from_inside_go_nowhere(box: Box, upstream: Upstream) -> None:
    code = (
        ATTEMPTS
        + f"""
attempt("dns-pinned", lambda: socket.getaddrinfo("allowed.test", 80))
attempt("tcp-host-loopback", lambda: socket.create_connection(("127.0.0.1", {upstream.port}), timeout=5))
attempt("tcp-public", lambda: socket.create_connection(("1.1.1.1", 80), timeout=5))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
attempt("udp-dns", lambda: u.sendto(b"x", ("8.8.8.8", 53)))
"""
    )
    before = len(upstream.requests)
    r = await run(box, upstream, "python3", "-c", code)
    got = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert got["dns-pinned"].startswith("gaierror"), got
    assert got["tcp-host-loopback"] == "ConnectionRefusedError ECONNREFUSED", got
    assert got["tcp-public"].endswith("ENETUNREACH") and got["udp-dns"].endswith("ENETUNREACH"), got
    assert r.network_audit == ()  # none of them reached the proxy
    assert len(upstream.requests) == before


@as_root
async def test_the_engines_allow_list_is_every_runs_network_unless_it_says_off(
    docker_daemon: Daemon, test_image: str, tmp_path: Path, upstream: Upstream
) -> None:
    url = f"http://allowed.test:{upstream.port}/hello.txt"
    opened = container_engine(docker_daemon, test_image, tmp_path / "ws", pool_size=0, network=_policy(upstream))
    async with opened as engine:
        assert engine.describe().details["network"].startswith("allow-list through the egress proxy")
        ws = await engine.manager.create_workspace("egress/engine")
        r = await engine.runner.run_program(ws, RunProgramSpec("curl", ["-sSf", "-m", "20", url], timeout=60))
        assert (r.exit_code, r.stdout) == (0, HELLO), r.stderr
        assert [(a.host, a.allowed) for a in r.network_audit] == [("allowed.test", True)]
        off = RunProgramSpec("sh", ["-c", f'echo "[$HTTP_PROXY]"; curl -sSf -m 5 {url}'], network="off", timeout=60)
        r = await engine.runner.run_program(ws, off)
        assert r.exit_code != 0 and r.stdout == "[]\n" and r.network_audit == ()
        with pytest.raises(CapabilityError, match="network on"):
            await engine.runner.run_program(ws, RunProgramSpec("true", network="on"))


@as_root
async def test_a_started_program_and_concurrent_runs_have_their_own_proxy_and_audit(
    box: Box, upstream: Upstream
) -> None:
    engine, ws = box
    ok = f"http://allowed.test:{upstream.port}/hello.txt"
    refused = f"http://denied.test:{upstream.port}/hello.txt"
    spec = RunProgramSpec("sh", ["-c", f'echo "$HTTP_PROXY"; curl -sSf -m 20 {ok}'], network=_policy(upstream))
    async with await engine.runner.start_program(ws, spec) as handle:
        started = await handle.wait()
    assert started.exit_code == 0 and started.stdout.endswith(HELLO), started.stderr
    assert [(a.host, a.allowed) for a in started.network_audit] == [("allowed.test", True)]
    both = await asyncio.gather(
        run(box, upstream, "sh", "-c", f'echo "$HTTP_PROXY"; curl -sSf -m 20 {ok}'),
        run(box, upstream, "sh", "-c", f'echo "$HTTP_PROXY"; curl -sSf -m 20 {refused}'),
    )
    assert [r.exit_code == 0 for r in both] == [True, False]
    assert [[a.host for a in r.network_audit] for r in both] == [["allowed.test"], ["denied.test"]]
    proxies = {r.stdout.splitlines()[0] for r in (started, *both)}
    assert len(proxies) == 3 and all(p.startswith("http://127.0.0.1:") for p in proxies)


@as_root
async def test_a_networked_container_refuses_allow_lists(
    docker_daemon: Daemon, test_image: str, tmp_path: Path, upstream: Upstream
) -> None:
    async with container_engine(docker_daemon, test_image, tmp_path / "ws", pool_size=0, network="bridge") as engine:
        assert not engine.describe().network_domains
        ws = await engine.manager.create_workspace("egress/networked")
        with pytest.raises(CapabilityError, match="bypasses the proxy"):
            await engine.runner.run_program(ws, RunProgramSpec("true", network=_policy(upstream)))


@as_root
async def test_a_pooled_container_takes_the_engines_allow_list_and_its_approval_flow(
    docker_daemon: Daemon, test_image: str, tmp_path: Path, upstream: Upstream
) -> None:
    asked: list[tuple[str, int]] = []

    async def ask(attempt: NetworkAttempt) -> bool:
        asked.append((attempt.host, attempt.port))
        return False

    policy = _policy(upstream)
    root = tmp_path / "ws"
    async with container_engine(
        docker_daemon, test_image, root, warm=True, network=policy, on_network_attempt=ask
    ) as engine:
        ws = await engine.manager.create_workspace("egress/pooled")  # adopts the warm container
        url = f"http://other.test:{upstream.port}/hello.txt"
        r = await engine.runner.run_program(ws, RunProgramSpec("curl", ["-sSf", "-m", "20", url], timeout=60))
        assert r.exit_code != 0
        assert asked == [("other.test", upstream.port)]
        (attempt,) = r.network_audit
        assert not attempt.allowed and "on_network_attempt did not approve it" in attempt.reason


def test_allow_lists_need_root_a_local_daemon_and_no_daemon_network() -> None:
    local = "unix:///run/docker.sock"
    assert (egress_unavailable(local, networked=False) is None) == (os.geteuid() == 0)
    if os.geteuid() != 0:
        assert "must run as root" in str(egress_unavailable(local, networked=False))
    else:
        assert "over TCP" in str(egress_unavailable("tcp://10.0.0.1:2375", networked=False))
    assert "bypasses any proxy" in str(egress_unavailable(local, networked=True))
