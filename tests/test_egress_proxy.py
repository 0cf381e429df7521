"""The egress proxy on its own, against upstream servers on loopback that the tests start, named through its
resolver pins (``allowed.test``, ``denied.test``): what it lets through, what it refuses, and what it audits."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from execspace.errors import InvalidSpec
from execspace.models import NetworkAttempt, NetworkPolicy
from execspace.process.egress import EgressProxy
from execspace.process.egresswire import Incomplete, Malformed, client_hello_sni


@dataclass
class Upstream:
    """A loopback server: HTTP answers name the path and Host it got; anything else is echoed."""

    port: int = 0
    received: list[bytes] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read(65536)
        self.received.append(data)
        if data.startswith((b"GET ", b"POST ")):
            line, _, rest = data.partition(b"\r\n")
            body = line + b"|" + (b"close" if b"Connection: close" in rest else b"keep")
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        else:
            while data:
                writer.write(data)
                await writer.drain()
                data = await reader.read(65536)
        await writer.drain()
        writer.close()


@dataclass
class Rig:
    proxy: EgressProxy
    port: int
    upstream: Upstream
    other: Upstream
    records: list[NetworkAttempt]
    clients: list[asyncio.StreamWriter] = field(default_factory=list)

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.clients.append(writer)
        return reader, writer


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    up, other = Upstream(), Upstream()
    servers = [await asyncio.start_server(u.handle, "127.0.0.1", 0) for u in (up, other)]
    up.port, other.port = (s.sockets[0].getsockname()[1] for s in servers)
    policy = NetworkPolicy.allow(
        [f"allowed.test:{up.port}", f"*.wild.test:{up.port}", f"denied.test:{up.port}", f"localhost:{up.port}"],
        deny=["denied.test"],
        resolve={"allowed.test": "127.0.0.1", "denied.test": "127.0.0.1", "a.wild.test": "127.0.0.1"},
    )
    records: list[NetworkAttempt] = []
    proxy = EgressProxy(policy, "run-1", on_record=records.append, max_connections=8)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    await proxy.serve(listener)
    yield (made := Rig(proxy, port, up, other, records))
    for writer in made.clients:
        writer.close()
    proxy.close()
    for s in servers:
        s.close()


async def _connect_method(rig: Rig, target: str) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await rig.connect()
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    status = await reader.readuntil(b"\r\n\r\n")
    return status, reader, writer


async def _last(rig: Rig, count: int = 1) -> NetworkAttempt:
    for _ in range(200):
        if len(rig.records) >= count:
            return rig.records[count - 1]
        await asyncio.sleep(0.01)
    raise AssertionError(f"no attempt #{count} audited: {rig.records}")


async def test_connect_to_an_allowed_name_reaches_its_server_and_is_audited(rig: Rig) -> None:
    status, reader, writer = await _connect_method(rig, f"allowed.test:{rig.upstream.port}")
    assert status.startswith(b"HTTP/1.1 200")
    writer.write(b"ping")
    assert await reader.readexactly(4) == b"ping"
    writer.close()
    attempt = await _last(rig)
    assert (attempt.host, attempt.port, attempt.protocol, attempt.allowed) == (
        "allowed.test",
        rig.upstream.port,
        "connect",
        True,
    )
    assert attempt.address == "127.0.0.1" and attempt.bytes_up == 4 and attempt.bytes_down == 4
    assert attempt.run_id == "run-1" and "allowed.test" in attempt.reason


async def test_plain_http_is_forwarded_in_origin_form_with_connection_close(rig: Rig) -> None:
    reader, writer = await rig.connect()
    host = f"allowed.test:{rig.upstream.port}"
    writer.write(f"GET http://{host}/x?y=1 HTTP/1.1\r\nHost: {host}\r\nProxy-Connection: keep-alive\r\n\r\n".encode())
    reply = await reader.read()
    assert reply.startswith(b"HTTP/1.0 200") and reply.endswith(b"GET /x?y=1 HTTP/1.1|close")
    attempt = await _last(rig)
    assert attempt.protocol == "http" and attempt.method == "GET" and attempt.allowed


async def test_socks5_with_a_name_reaches_its_server(rig: Rig) -> None:
    reader, writer = await rig.connect()
    writer.write(b"\x05\x01\x00")
    assert await reader.readexactly(2) == b"\x05\x00"
    name = b"a.wild.test"
    writer.write(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + rig.upstream.port.to_bytes(2, "big"))
    assert (await reader.readexactly(10))[:2] == b"\x05\x00"
    writer.write(b"hello")
    assert await reader.readexactly(5) == b"hello"
    writer.close()
    attempt = await _last(rig)
    assert attempt.protocol == "socks5" and attempt.allowed and attempt.host == "a.wild.test"


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("denied.test:{port}", "denied by 'denied.test'"),
        ("elsewhere.test:{port}", "not on the allow-list"),
        ("allowed.test:{other}", "port"),
        ("127.0.0.1:{port}", "address 127.0.0.1 is not on the allow-list"),
        ("[::1]:{port}", "address ::1 is not on the allow-list"),
        ("[::ffff:127.0.0.1]:{port}", "not on the allow-list"),
        ("localhost:{port}", "not a public address"),
        ("wild.test:{port}", "not on the allow-list"),
    ],
)
async def test_connect_refusals_name_their_reason_and_reach_nothing(rig: Rig, target: str, reason: str) -> None:
    status, reader, _ = await _connect_method(rig, target.format(port=rig.upstream.port, other=rig.other.port))
    assert status.startswith(b"HTTP/1.1 403")
    assert reason in (await reader.read()).decode()
    attempt = await _last(rig)
    assert not attempt.allowed and reason in attempt.reason and attempt.address == ""
    assert rig.upstream.received == [] and rig.other.received == []


async def test_plain_http_with_a_host_header_other_than_the_target_is_refused(rig: Rig) -> None:
    reader, writer = await rig.connect()
    writer.write(f"GET http://allowed.test:{rig.upstream.port}/ HTTP/1.1\r\nHost: evil.test\r\n\r\n".encode())
    assert (await reader.read()).startswith(b"HTTP/1.1 403")
    attempt = await _last(rig)
    assert not attempt.allowed and "Host header" in attempt.reason
    assert rig.upstream.received == []


def _client_hello(server_name: str) -> bytes:
    context = ssl.create_default_context()
    tls = context.wrap_bio(ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_the_sni_of_a_real_client_hello_is_read() -> None:
    assert client_hello_sni(_client_hello("allowed.test")) == "allowed.test"
    with pytest.raises(Incomplete):
        client_hello_sni(b"\x16\x03\x01\x00")
    with pytest.raises(Malformed):
        client_hello_sni(b"GET / HTTP/1.1\r\n")


async def test_a_tls_client_hello_naming_another_host_is_not_forwarded(rig: Rig) -> None:
    status, reader, writer = await _connect_method(rig, f"allowed.test:{rig.upstream.port}")
    assert status.startswith(b"HTTP/1.1 200")
    writer.write(_client_hello("evil.test"))
    assert await reader.read() == b""
    attempt = await _last(rig)
    assert not attempt.allowed and "SNI 'evil.test'" in attempt.reason
    await asyncio.sleep(0)  # the upstream accepted; it must have received nothing
    assert all(r == b"" for r in rig.upstream.received)


async def test_a_tls_client_hello_naming_the_target_goes_through(rig: Rig) -> None:
    status, reader, writer = await _connect_method(rig, f"allowed.test:{rig.upstream.port}")
    hello = _client_hello("allowed.test")
    writer.write(hello)
    assert await reader.readexactly(len(hello)) == hello  # the echo server sends it back
    writer.close()
    assert (await _last(rig)).allowed


async def test_socks5_refuses_ip_literals_and_udp(rig: Rig) -> None:
    for request in (
        b"\x05\x01\x00\x01\x7f\x00\x00\x01" + rig.upstream.port.to_bytes(2, "big"),
        b"\x05\x03\x00\x01\x7f\x00\x00\x01\x00\x35",  # UDP ASSOCIATE
    ):
        reader, writer = await rig.connect()
        writer.write(b"\x05\x01\x00")
        assert await reader.readexactly(2) == b"\x05\x00"
        writer.write(request)
        reply = await reader.readexactly(10)
        assert reply[1] in (0x02, 0x07)
    first, second = await _last(rig, 1), await _last(rig, 2)
    assert not first.allowed and not second.allowed and "UDP" in second.reason
    assert rig.upstream.received == []


async def test_connections_beyond_the_cap_are_refused_and_audited(rig: Rig) -> None:
    held = [await rig.connect() for _ in range(8)]
    for _ in range(200):  # every held connection is being served (waiting for its request)
        if len(rig.proxy._live) == 8:
            break
        await asyncio.sleep(0.01)
    reader, _ = await rig.connect()
    assert await reader.read() == b""
    attempt = await _last(rig)
    assert not attempt.allowed and "too many connections" in attempt.reason
    for _, w in held:
        w.close()


async def test_close_cuts_open_tunnels_and_keeps_their_bytes(rig: Rig) -> None:
    status, reader, writer = await _connect_method(rig, f"allowed.test:{rig.upstream.port}")
    writer.write(b"12345")
    await reader.readexactly(5)
    rig.proxy.close()
    assert await reader.read() == b""
    (attempt,) = rig.proxy.audit()
    assert attempt.allowed and attempt.bytes_up == 5 and attempt.bytes_down == 5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"domains": ["exa mple.com"]},
        {"domains": ["example.com:0"]},
        {"domains": ["*.*.com:99999"]},
        {"domains": ["example.com"], "resolve": {"example.com": "not-an-ip"}},
        {"domains": ["example.com"], "resolve": {"*.example.com": "1.2.3.4"}},
        {"domains": "example.com"},
        {"domains": ["10.0.0.0/33"]},
        {"domains": ["10.0.0.0/8:**"]},
        {"domains": ["example.com"], "resolve": {"example.com:*": "1.2.3.4"}},
    ],
)
def test_malformed_policies_are_refused_saying_what_is_wrong(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidSpec):
        NetworkPolicy.allow(**kwargs)  # type: ignore[arg-type]


async def test_an_approval_flow_decides_unlisted_names_once_each_never_denied_ones(rig: Rig) -> None:
    asked: list[NetworkAttempt] = []

    async def approve(attempt: NetworkAttempt) -> bool | None:
        asked.append(attempt)
        return attempt.host in ("yes.test", "127.0.0.1") or None

    policy = NetworkPolicy.allow(
        [], deny=["denied.test"], resolve={name: "127.0.0.1" for name in ("yes.test", "no.test", "denied.test")}
    )
    proxy = EgressProxy(policy, "run-2", approve=approve)
    listener = socket.create_server(("127.0.0.1", 0))
    rig.port = listener.getsockname()[1]
    await proxy.serve(listener)
    try:
        for _ in range(2):
            status, reader, writer = await _connect_method(rig, f"yes.test:{rig.upstream.port}")
            assert status.startswith(b"HTTP/1.1 200")
            writer.write(b"ok")
            assert await reader.readexactly(2) == b"ok"
            writer.close()
        for target in ("no.test", "denied.test", "127.0.0.1"):
            status, _, _ = await _connect_method(rig, f"{target}:{rig.upstream.port}")
            assert status.startswith(b"HTTP/1.1 403")
    finally:
        proxy.close()
    assert [(a.host, a.allowed) for a in asked] == [("yes.test", False), ("no.test", False), ("127.0.0.1", False)]
    assert "not on the allow-list" in asked[0].reason
    reasons = {a.host: a.reason for a in proxy.audit()}
    assert reasons["yes.test"] == "approved by on_network_attempt"
    assert "did not approve" in reasons["no.test"] and reasons["denied.test"] == "denied by 'denied.test'"
    assert "not a public address" in reasons["127.0.0.1"]  # an approval does not lift the address check


async def test_network_entries_match_addresses_on_their_ports_and_a_denied_network_refuses_names_in_it(
    rig: Rig,
) -> None:
    """``127.0.0.0/29:*`` lets any port of its addresses through, a denied network wins over it (for an address and
    for a name pinned into it), and an address outside the network reaches nothing."""
    policy = NetworkPolicy.allow(
        ["127.0.0.0/29:*", "inside.test:*"],
        deny=["127.0.0.4/30"],
        resolve={"inside.test": "127.0.0.5"},
    )
    proxy = EgressProxy(policy, "run-3")
    listener = socket.create_server(("127.0.0.1", 0))
    rig.port = listener.getsockname()[1]
    await proxy.serve(listener)
    try:
        for port in (rig.upstream.port, rig.other.port):
            status, reader, writer = await _connect_method(rig, f"127.0.0.1:{port}")
            assert status.startswith(b"HTTP/1.1 200")
            writer.write(b"ok")
            assert await reader.readexactly(2) == b"ok"
        for target in ("127.0.0.5", "127.0.0.9", "inside.test"):
            status, _, _ = await _connect_method(rig, f"{target}:{rig.upstream.port}")
            assert status.startswith(b"HTTP/1.1 403"), target
    finally:
        proxy.close()
    reasons = {a.host: a.reason for a in proxy.audit()}
    assert reasons["127.0.0.1"] == "allowed by '127.0.0.0/29:*'"
    assert reasons["127.0.0.5"] == "denied by '127.0.0.4/30'"
    assert "not on the allow-list" in reasons["127.0.0.9"]
    assert reasons["inside.test"] == "inside.test resolves to 127.0.0.5, denied by '127.0.0.4/30'"


async def test_the_entry_star_allows_every_public_destination_and_nothing_else(rig: Rig) -> None:
    """``*:*`` matches every name and address on every port, but the address check stays: loopback, private and
    the like are refused (unless pinned, as ``allowed.test`` is here), and a deny entry still wins."""
    policy = NetworkPolicy.allow(["*:*"], deny=["denied.test"], resolve={"allowed.test": "127.0.0.1"})
    proxy = EgressProxy(policy, "run-4")
    listener = socket.create_server(("127.0.0.1", 0))
    rig.port = listener.getsockname()[1]
    await proxy.serve(listener)
    try:
        for port in (rig.upstream.port, rig.other.port):
            status, reader, writer = await _connect_method(rig, f"allowed.test:{port}")
            assert status.startswith(b"HTTP/1.1 200")
            writer.write(b"ok")
            assert await reader.readexactly(2) == b"ok"
        for target in ("127.0.0.1", "localhost", "10.0.0.1", "[::1]", "denied.test"):
            status, _, _ = await _connect_method(rig, f"{target}:{rig.upstream.port}")
            assert status.startswith(b"HTTP/1.1 403"), target
    finally:
        proxy.close()
    reasons = {a.host: a.reason for a in proxy.audit()}
    assert reasons["allowed.test"] == "allowed by '*:*'"
    assert "not a public address" in reasons["127.0.0.1"] and "not a public address" in reasons["10.0.0.1"]
    assert reasons["denied.test"] == "denied by 'denied.test'"
