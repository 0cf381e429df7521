"""Round 3 attacks on the egress proxy (issue 28, findings 8 and 9; issue 29, item 8) and on ``execspace serve``'s
egress rules: the real proxy on real sockets, with an upstream listener the test owns. What is observed is what
reaches that listener (connections, bytes) and what the proxy's audit records.

- a TLS ClientHello split across records (in one write or several) is judged on its whole SNI; an incomplete or
  malformed one is refused;
- an HTTP head that two parsers could read two ways (bare LF or CR, obs-fold, two ``Host``, control characters,
  a body framed twice) is refused with a 400 and forwards nothing;
- fuzzed SOCKS5, HTTP and TLS inputs never crash the proxy, never hold a connection past its timeout, and never
  get a connection judged on anything but a fully parsed, allowed target;
- a serve sandbox never reaches the server's host through its proxy (loopback, the host's own addresses), unless
  the address is pinned with ``--resolve``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import random
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from execspace.models import NetworkAttempt, NetworkPolicy
from execspace.process.egress import EgressProxy
from execspace.process.egresswire import (
    ClientHelloReader,
    HeadReader,
    Incomplete,
    Malformed,
    client_hello_sni,
    http_request,
    socks5_methods,
    socks5_request,
    target_host,
)

pytestmark = pytest.mark.timeout(300)

#: The proxy's request timeout in these tests: a request still incomplete after it is refused.
TIMEOUT = 1.0
_T = TypeVar("_T")


@dataclass
class Upstream:
    """What reached the test's loopback listener: GET requests are answered ``upstream``, anything else echoed."""

    port: int = 0
    connections: int = 0
    received: bytearray = field(default_factory=bytearray)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                self.received += data
                if data.startswith(b"GET "):
                    writer.write(b"HTTP/1.0 200 OK\r\n\r\nupstream")
                    break
                writer.write(data)
                await writer.drain()
            await writer.drain()
        writer.close()


class Rig:
    """An :class:`EgressProxy` allowing ``allowed.test`` on the upstream's port (pinned to 127.0.0.1), served by a
    loop on a thread of its own, so that the test speaks to it over plain blocking sockets. Any exception the
    loop sees unhandled (a connection's task that crashed) lands in ``crashes``."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.crashes: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda _, context: self.crashes.append(context))
        self.thread = threading.Thread(target=self.loop.run_forever, name="egress-rig")
        self.thread.start()
        self.upstream = Upstream()
        self.records: list[NetworkAttempt] = []
        self._server = self.call(asyncio.start_server(self.upstream.handle, "127.0.0.1", 0))
        self.upstream.port = self._server.sockets[0].getsockname()[1]
        policy = NetworkPolicy.allow([f"allowed.test:{self.upstream.port}"], resolve={"allowed.test": "127.0.0.1"})
        self.proxy = EgressProxy(policy, "run-r3", on_record=self.records.append, request_timeout=TIMEOUT)
        listener = socket.create_server(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        self.call(self.proxy.serve(listener))

    def call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.proxy.close)
        self.loop.call_soon_threadsafe(self._server.close)
        self.call(asyncio.sleep(0.05))  # the cut connections' tasks end
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT + 5)

    def buffered(self) -> int:
        """Bytes the proxy has read from its client and not yet passed on (one connection at a time here)."""

        async def count() -> int:
            return max((len(conn.client.buffer) for conn in self.proxy._live.values()), default=0)

        return self.call(count())

    def until(self, what: str, check: Callable[[], bool], within: float = 10.0) -> None:
        deadline = time.monotonic() + within
        while not check():
            assert time.monotonic() < deadline, f"{what} did not happen within {within}s"
            time.sleep(0.005)

    def settled(self, *, collect: bool = True) -> None:
        """Every connection has ended (its task is gone, its attempt recorded) and none crashed."""

        async def live() -> int:
            return len(self.proxy._live)

        self.until("the proxy's connections ending", lambda: self.call(live()) == 0)
        if collect:
            gc.collect()  # a crashed task reports its exception when it is collected
        assert self.crashes == [], self.crashes

    def last(self, count: int) -> NetworkAttempt:
        self.until(f"attempt #{count} being audited", lambda: len(self.records) >= count)
        return self.records[count - 1]


@pytest.fixture
def rig() -> Iterator[Rig]:
    made = Rig()
    try:
        yield made
        made.settled()  # and no connection crashed, in any test
    finally:
        made.close()


def _read_all(sock: socket.socket) -> bytes:
    """Everything until the proxy closes (a ``socket.timeout`` here means the proxy held the connection)."""
    reply = bytearray()
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            reply += chunk
    return bytes(reply)


def _tunnel(rig: Rig, sock: socket.socket) -> None:
    target = f"allowed.test:{rig.upstream.port}"
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    reply = b""
    while not reply.endswith(b"\r\n\r\n"):
        reply += sock.recv(1)
    assert reply.startswith(b"HTTP/1.1 200"), reply


# -- TLS: a ClientHello split across records -----------------------------------------------------------------


_TLS = ssl.create_default_context()


def _client_hello(server_name: str) -> bytes:
    tls = _TLS.wrap_bio(ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def _handshake(records: bytes) -> bytes:
    """The handshake messages the records carry."""
    message, pos = bytearray(), 0
    while pos < len(records):
        length = int.from_bytes(records[pos + 3 : pos + 5], "big")
        message += records[pos + 5 : pos + 5 + length]
        pos += 5 + length
    return bytes(message)


def _records(message: bytes, cuts: list[int]) -> list[bytes]:
    """``message`` as handshake records cut at ``cuts``."""
    edges = [0, *sorted({c for c in cuts if 0 < c < len(message)}), len(message)]
    return [b"\x16\x03\x01" + (b - a).to_bytes(2, "big") + message[a:b] for a, b in itertools.pairwise(edges)]


EVIL_HELLO = _handshake(_client_hello("evil.test"))
GOOD_HELLO = _handshake(_client_hello("allowed.test"))


def test_the_first_record_of_a_split_hello_names_nothing_the_proxy_could_judge() -> None:
    """The attack's premise: its first record (40 bytes: no extensions yet) holds no server name at all."""
    first = _records(EVIL_HELLO, [40])[0]
    with pytest.raises(Incomplete):
        client_hello_sni(first)
    assert b"evil.test" not in first


@pytest.mark.parametrize("writes", ["one write", "a write per record"])
def test_a_client_hello_split_across_records_is_judged_on_its_whole_sni(rig: Rig, writes: str) -> None:
    records = _records(EVIL_HELLO, [40, 41, 300])
    with rig.connect() as sock:
        _tunnel(rig, sock)
        if writes == "one write":
            sock.sendall(b"".join(records))
        else:
            sent = 0
            for record in records[:-1]:  # each read by the proxy before the next is sent: TCP cannot merge them
                sock.sendall(record)
                sent += len(record)
                rig.until("the proxy reading the record", lambda: rig.buffered() >= sent)  # noqa: B023
            sock.sendall(records[-1])
        assert _read_all(sock) == b""  # cut, without a byte from the upstream
    attempt = rig.last(1)
    assert not attempt.allowed and "the TLS SNI 'evil.test' differs" in attempt.reason
    rig.settled()
    assert rig.upstream.received == b""  # not one byte of the hello went on


def test_a_client_hello_naming_the_target_goes_through_whatever_its_records(rig: Rig) -> None:
    records = b"".join(_records(GOOD_HELLO, [1, 2, 3, 4, 100]))
    with rig.connect() as sock:
        _tunnel(rig, sock)
        sock.sendall(records)
        echoed = b""
        while len(echoed) < len(records):
            echoed += sock.recv(65536)
    assert echoed == records and bytes(rig.upstream.received) == records
    rig.settled()
    assert rig.last(1).allowed


def _sni(*names: bytes) -> bytes:
    entries = b"".join(b"\x00" + len(n).to_bytes(2, "big") + n for n in names)
    body = len(entries).to_bytes(2, "big") + entries
    return b"\x00\x00" + len(body).to_bytes(2, "big") + body


def _hello(extensions: bytes) -> bytes:
    """A minimal ClientHello handshake message with these extensions."""
    body = b"\x03\x03" + bytes(32) + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    body += len(extensions).to_bytes(2, "big") + extensions
    return b"\x01" + len(body).to_bytes(3, "big") + body


#: Hellos the proxy must refuse, and the reason it gives (the first is left waiting: the timeout refuses it).
BAD_HELLOS = {
    "incomplete": (_records(GOOD_HELLO, [60])[0], "was not complete within"),
    "a record that is not TLS": (_records(GOOD_HELLO, [60])[0] + b"GET / HTTP/1.1\r\n", "other than a handshake"),
    "a giant hello": (b"\x16\x03\x01\x00\x04\x01\x01\x00\x00", "a ClientHello of 65540 bytes"),
    "not a ClientHello": (b"\x16\x03\x01\x00\x04\x02\x00\x00\x00", "not a ClientHello"),
    "an empty record": (b"\x16\x03\x01\x00\x00", "a handshake record of 0 bytes"),
    "two server name extensions": (
        _records(_hello(_sni(b"allowed.test") + _sni(b"evil.test")), [])[0],
        "extension 0 twice",
    ),
    "two names in one": (_records(_hello(_sni(b"allowed.test", b"evil.test")), [])[0], "two host names"),
    "a name that is no name": (_records(_hello(_sni(b"allowed.test\x00evil")), [])[0], "not a host name"),
    "a length past the end": (
        _records(_hello(b"\x00\x00\x00\x06\x00\x10\x00\x00\x01a"), [])[0],  # a name list of 16 bytes in 4
        "past the end",
    ),
}


@pytest.mark.parametrize("label", list(BAD_HELLOS))
def test_an_incomplete_or_malformed_client_hello_is_refused(rig: Rig, label: str) -> None:
    data, reason = BAD_HELLOS[label]
    with rig.connect() as sock:
        _tunnel(rig, sock)
        started = time.monotonic()
        sock.sendall(data)
        assert _read_all(sock) == b""
        elapsed = time.monotonic() - started
    attempt = rig.last(1)
    assert not attempt.allowed and reason in attempt.reason, attempt.reason
    rig.settled()
    assert rig.upstream.received == b""
    assert elapsed < TIMEOUT + 3
    if label == "incomplete":
        assert elapsed >= TIMEOUT * 0.9


def test_a_hello_without_a_server_name_is_let_through_on_the_connect_target(rig: Rig) -> None:
    """TLS without SNI (an address target, say) is judged on the CONNECT name alone, as documented."""
    record = _records(_hello(b""), [])[0]
    with rig.connect() as sock:
        _tunnel(rig, sock)
        sock.sendall(record)
        assert sock.recv(65536) == record  # echoed by the upstream
    rig.settled()
    assert rig.last(1).allowed and bytes(rig.upstream.received) == record


def test_a_client_hello_cut_short_by_the_client_is_refused(rig: Rig) -> None:
    with rig.connect() as sock:
        _tunnel(rig, sock)
        sock.sendall(_records(GOOD_HELLO, [60])[0])
        sock.shutdown(socket.SHUT_WR)
        assert _read_all(sock) == b""
    attempt = rig.last(1)
    assert not attempt.allowed and "ended before it was complete" in attempt.reason
    rig.settled()
    assert rig.upstream.received == b""


# -- HTTP: heads two parsers could read two ways --------------------------------------------------------------

#: Each head asks for allowed.test (``{t}``) and smuggles another host or framing past a lenient reader.
SMUGGLED_HEADS = {
    "bare LF": (b"GET http://{t}/ HTTP/1.1\r\nHost: {t}\r\nX-A: 1\nHost: evil.test\r\n\r\n", "bare LF"),
    "bare LF end": (b"GET http://{t}/ HTTP/1.1\nHost: {t}\n\n", "bare LF"),
    "bare CR": (b"GET http://{t}/ HTTP/1.1\r\nHost: {t}\r\nX-A: 1\rHost: evil.test\r\n\r\n", "bare CR"),
    "obs-fold": (b"GET http://{t}/ HTTP/1.1\r\nHost: {t}\r\nX-A: 1\r\n Host: evil.test\r\n\r\n", "obs-fold"),
    "two Host": (b"GET http://{t}/ HTTP/1.1\r\nHost: {t}\r\nHost: evil.test\r\n\r\n", "multiple Host"),
    "NUL": (b"GET http://{t}/ HTTP/1.1\r\nHost: {t}\r\nX-A: 1\x00Host: evil.test\r\n\r\n", "control character"),
    "VT": (b"GET http://{t}/ HTTP/1.1\r\nHost: {t}\r\nX-A: 1\x0bHost: evil.test\r\n\r\n", "control character"),
    "framed twice": (
        b"POST http://{t}/ HTTP/1.1\r\nHost: {t}\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
        "framed twice",
    ),
    "two lengths": (
        b"POST http://{t}/ HTTP/1.1\r\nHost: {t}\r\nContent-Length: 4\r\nContent-Length: 40\r\n\r\n",
        "Content-Length",
    ),
    "space before colon": (b"GET http://{t}/ HTTP/1.1\r\nHost : evil.test\r\nHost: {t}\r\n\r\n", "header line"),
    "HTTP/2 text": (b"GET http://{t}/ HTTP/2.0\r\nHost: {t}\r\n\r\n", "HTTP/2.0"),
}


@pytest.mark.parametrize("label", list(SMUGGLED_HEADS))
def test_an_ambiguous_http_head_gets_a_400_and_reaches_nothing(rig: Rig, label: str) -> None:
    head, reason = SMUGGLED_HEADS[label]
    with rig.connect() as sock:
        sock.sendall(head.replace(b"{t}", f"allowed.test:{rig.upstream.port}".encode()))
        reply = _read_all(sock)
    assert reply.startswith(b"HTTP/1.1 400 Bad Request"), reply
    assert reason.encode() in reply
    attempt = rig.last(1)
    assert not attempt.allowed and reason in attempt.reason and attempt.protocol == "http", attempt
    rig.settled()
    assert rig.upstream.connections == 0


def test_a_strict_head_is_forwarded_as_parsed(rig: Rig) -> None:
    """The control: the same request, well formed, reaches the upstream in origin form, once."""
    target = f"allowed.test:{rig.upstream.port}"
    with rig.connect() as sock:
        sock.sendall(f"GET http://{target}/x HTTP/1.1\r\nHost: {target}\r\nX-A: 1\r\n\r\n".encode())
        assert _read_all(sock).endswith(b"upstream")
    assert bytes(rig.upstream.received) == (
        f"GET /x HTTP/1.1\r\nHost: {target}\r\nX-A: 1\r\nConnection: close\r\n\r\n".encode()
    )
    rig.settled()


def test_a_head_that_never_ends_is_refused_after_the_timeout(rig: Rig) -> None:
    with rig.connect() as sock:
        sock.sendall(f"GET http://allowed.test:{rig.upstream.port}/ HTTP/1.1\r\nHost: a".encode())
        started = time.monotonic()
        assert _read_all(sock) == b""
        assert time.monotonic() - started < TIMEOUT + 3
    attempt = rig.last(1)
    assert not attempt.allowed and "no complete request within" in attempt.reason
    rig.settled()
    assert rig.upstream.connections == 0


# -- fuzzing: the parsers alone -------------------------------------------------------------------------------

_PARSERS: dict[str, Callable[[bytes], object]] = {
    "client hello": client_hello_sni,
    "socks5 greeting": socks5_methods,
    "socks5 request": socks5_request,
    "http head": lambda data: http_request(data[: HeadReader().end(data)]),
    "host": target_host,
}


def _mutated(valid: bytes) -> st.SearchStrategy[bytes]:
    """``valid`` with a few bytes changed, cut or inserted (the inputs a parser is most likely to get wrong)."""
    edit = st.tuples(st.sampled_from(["set", "cut", "insert"]), st.integers(0, len(valid)), st.binary(max_size=3))

    def apply(edits: list[tuple[str, int, bytes]]) -> bytes:
        data = bytearray(valid)
        for kind, at, blob in edits:
            at = min(at, len(data))
            if kind == "set" and blob and at < len(data):
                data[at] = blob[0]
            elif kind == "cut":
                del data[at:]
            else:
                data[at:at] = blob
        return bytes(data)

    return st.lists(edit, min_size=1, max_size=3).map(apply)


SOCKS_REQUEST = b"\x05\x01\x00\x03\x0callowed.test\x01\xbb"
CONNECT_HEAD = b"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n"


@settings(max_examples=3000, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(list(_PARSERS)),
    data=st.binary(max_size=300)
    | _mutated(b"".join(_records(GOOD_HELLO, [50])))
    | _mutated(SOCKS_REQUEST)
    | _mutated(b"\x05\x02\x00\x02")
    | _mutated(CONNECT_HEAD),
)
def test_fuzz_each_parser_answers_or_raises_only_its_own_errors(name: str, data: bytes) -> None:
    with contextlib.suppress(Incomplete, Malformed):
        _PARSERS[name](data)


@settings(max_examples=500, deadline=None, database=None)
@given(
    name=st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\.[a-z][a-z0-9]{0,10}){1,3}", fullmatch=True),
    cuts=st.lists(st.integers(1, 600), max_size=8),
    reads=st.lists(st.integers(1, 400), min_size=1, max_size=8),
)
def test_fuzz_a_client_hello_in_any_records_and_reads_is_read_whole(
    name: str, cuts: list[int], reads: list[int]
) -> None:
    """However the hello is cut into records, and the records into reads, the name is the whole hello's; every
    prefix short of the whole is incomplete, never judged."""
    data = b"".join(_records(_handshake(_client_hello(name)), cuts))
    reader, seen, i = ClientHelloReader(), 0, 0
    while seen < len(data):
        seen = min(len(data), seen + reads[i % len(reads)])
        i += 1
        try:
            found = reader.server_name(data[:seen])
        except Incomplete:
            assert seen < len(data)
            continue
        assert seen == len(data) and found == name
    assert client_hello_sni(data) == name


# -- fuzzing: the proxy over sockets ------------------------------------------------------------------------


def _socks_valid(port: int) -> bytes:
    return b"\x05\x01\x00" + b"\x05\x01\x00\x03\x0callowed.test" + port.to_bytes(2, "big")


def _http_valid(port: int) -> bytes:
    t = f"allowed.test:{port}".encode()
    return b"GET http://" + t + b"/ HTTP/1.1\r\nHost: " + t + b"\r\n\r\n"


#: How each fuzzed input starts: a SOCKS5 negotiation, an HTTP head, or a TLS hello through a good tunnel.
_KINDS = ("socks5", "http", "tls")


@settings(max_examples=600, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(_KINDS), edits=st.data())
def test_fuzz_the_proxy_never_crashes_hangs_or_judges_a_half_parsed_target(
    rig: Rig, kind: str, edits: st.DataObject
) -> None:
    port = rig.upstream.port
    valid = {"socks5": _socks_valid(port), "http": _http_valid(port), "tls": b"".join(_records(GOOD_HELLO, [70]))}
    data = edits.draw(_mutated(valid[kind]) | st.binary(max_size=200), label="input")
    before, audited, received = rig.upstream.connections, len(rig.records), len(rig.upstream.received)
    with rig.connect() as sock:
        if kind == "tls":
            _tunnel(rig, sock)
            rig.until("the tunnel's upstream connection", lambda: rig.upstream.connections > before)
            before += 1  # connected before the hello is judged
        with contextlib.suppress(OSError):
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        started = time.monotonic()
        with contextlib.suppress(ConnectionResetError):
            _read_all(sock)  # raises socket.timeout if the proxy holds the connection past its timeout
        assert time.monotonic() - started < TIMEOUT + 3
    rig.settled(collect=False)  # collected once, at the rig's end
    attempts = rig.records[audited:]
    connected = rig.upstream.connections - before
    allowed = [a for a in attempts if a.allowed]
    assert connected == (0 if kind == "tls" else len(allowed))  # a connection only for an allowed attempt
    for attempt in allowed:  # judged on a whole, allowed target, never on a part of one
        assert (attempt.host, attempt.port, attempt.address) == ("allowed.test", port, "127.0.0.1"), attempt
    if kind == "tls":
        try:
            name = client_hello_sni(data)
        except (Incomplete, Malformed):
            name = "refused"
        if data[:1] == b"\x16" and name not in (None, "allowed.test"):
            assert len(rig.upstream.received) == received, data  # not one byte of a refused hello went on
            assert not attempts[-1].allowed


# -- serve: a sandbox never reaches the server's host -----------------------------------------------------------


def _free_loopback_address() -> str:
    return f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randrange(2, 254, 2)}"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str, Upstream]]:
    """A real ``execspace serve`` allowing the network, with ``pinned.test`` pinned to a loopback address only a
    listener of this test's answers on."""
    pytest.importorskip("e2b", reason="serve is tested with the official e2b SDK")
    from tests.server.conftest import running_server

    address = _free_loopback_address()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="upstreams")
    thread.start()
    upstream = Upstream()
    server = asyncio.run_coroutine_threadsafe(asyncio.start_server(upstream.handle, address, 0), loop).result(10)
    upstream.port = server.sockets[0].getsockname()[1]
    flags = ("--allow-internet-access", "--resolve", f"pinned.test={address}", "--pool-size", "0")
    try:
        with running_server(tmp_path_factory.mktemp("serve"), *flags) as running:
            yield running, address, upstream
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def _own_addresses() -> list[str]:
    """Addresses of this host's interfaces other than loopback (from ``ip``), if it has any."""
    try:
        shown = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return [
        a["local"]
        for link in json.loads(shown.stdout)
        for a in link.get("addr_info", [])
        if not a["local"].startswith("127.") and a["local"] != "::1"
    ]


def test_serve_refuses_allow_out_entries_that_reach_its_host(served: tuple[Any, str, Upstream]) -> None:
    import httpx

    server, address, _ = served
    host_entries = [
        "127.0.0.1",
        "127.0.0.0/8",
        "0.0.0.0/0",
        "::1",
        "::/0",
        "::ffff:127.0.0.1",
        "0.0.0.0",
        "localhost",
        "api.localhost",
        *[f"{a}/32" if ":" not in a else a for a in _own_addresses()[:2]],
    ]
    for entry in host_entries:
        body = {"templateID": "base", "network": {"allowOut": [entry], "denyOut": ["0.0.0.0/0"]}}
        answer = httpx.post(f"{server.url}/sandboxes", json=body, headers={"X-API-KEY": server.key}, timeout=30)
        assert answer.status_code == 400, (entry, answer.text)
        message = answer.json()["message"]
        assert answer.json()["code"] == 400 and f"network.allowOut entry {entry!r}" in message, message
        assert "never reaches the host's loopback or its own addresses" in message
    # the pinned address is the operator's: allowed, as is a name pinned to it
    body = {"templateID": "base", "network": {"allowOut": [address, "pinned.test"], "denyOut": ["0.0.0.0/0"]}}
    made = httpx.post(f"{server.url}/sandboxes", json=body, headers={"X-API-KEY": server.key}, timeout=60)
    assert made.status_code == 201, made.text
    httpx.delete(f"{server.url}/sandboxes/{made.json()['sandboxID']}", headers={"X-API-KEY": server.key}, timeout=30)


def test_a_serve_sandbox_reaches_its_pinned_upstream_and_never_the_servers_host(
    served: tuple[Any, str, Upstream], monkeypatch: pytest.MonkeyPatch
) -> None:
    from e2b import ALL_TRAFFIC, Sandbox
    from e2b.exceptions import SandboxException

    server, address, upstream = served
    for name, value in server.sdk_env().items():
        monkeypatch.setenv(name, value)
    loopback = Upstream()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="loopback-listener")
    thread.start()
    listener = asyncio.run_coroutine_threadsafe(asyncio.start_server(loopback.handle, "127.0.0.1", 0), loop).result(10)
    loopback.port = listener.sockets[0].getsockname()[1]
    server_port = int(server.url.rsplit(":", 1)[1])
    sbx = Sandbox.create(network={"allow_out": [address], "deny_out": [ALL_TRAFFIC]})
    try:

        def status(url: str) -> str:
            run = sbx.commands.run(f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 20 {url} || true")
            return run.stdout

        assert status(f"http://{address}:{upstream.port}/") == "200"
        for url in (
            f"http://127.0.0.1:{loopback.port}/",
            f"http://localhost:{loopback.port}/",
            f"http://127.0.0.1:{server_port}/health",
            f"http://[::1]:{loopback.port}/",
        ):
            assert status(url) == "403", url
        with pytest.raises(SandboxException, match=r"400: network.allowOut entry '127.0.0.1'"):
            sbx.update_network({"allow_out": ["127.0.0.1"], "deny_out": [ALL_TRAFFIC]})
        assert status(f"http://127.0.0.1:{loopback.port}/") == "403"  # a refused update changed nothing
        # the runs' audits, in the sandbox's workspace (gone with it)
        audits = [
            json.loads(line) for f in server.root.glob("*/runs/**/network.jsonl") for line in f.read_text().splitlines()
        ]
    finally:
        sbx.kill()
        loop.call_soon_threadsafe(listener.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    assert loopback.connections == 0  # the host's loopback listener never saw the sandbox
    refused = {(a["host"], a["port"]) for a in audits if not a["allowed"]}
    assert {("127.0.0.1", loopback.port), ("localhost", loopback.port), ("127.0.0.1", server_port)} <= refused


def test_a_serve_sandbox_with_the_network_on_never_reaches_the_servers_host(
    served: tuple[Any, str, Upstream], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``allow_internet_access=True`` is the proxy to every public destination, never the host: not its loopback
    (directly: the sandbox has a loopback of its own; or through the proxy, by address or name), not its own
    addresses. A pinned name still reaches its upstream (the operator's)."""
    from e2b import Sandbox

    server, _, upstream = served
    for name, value in server.sdk_env().items():
        monkeypatch.setenv(name, value)
    loopback = Upstream()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="loopback-listener")
    thread.start()
    listener = asyncio.run_coroutine_threadsafe(asyncio.start_server(loopback.handle, "0.0.0.0", 0), loop).result(10)
    loopback.port = listener.sockets[0].getsockname()[1]
    server_port = int(server.url.rsplit(":", 1)[1])
    sbx = Sandbox.create(allow_internet_access=True)
    try:
        assert sbx.get_info().allow_internet_access is True

        def status(url: str) -> str:
            return sbx.commands.run(f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 20 {url} || true").stdout

        assert status(f"http://pinned.test:{upstream.port}/") == "200"
        hosts = ["127.0.0.1", "localhost", "[::1]", "0.0.0.0", *[a for a in _own_addresses() if ":" not in a][:2]]
        for host in hosts:
            for port in (loopback.port, server_port):
                assert status(f"http://{host}:{port}/") == "403", (host, port)
        direct = sbx.commands.run(f"(exec 3<>/dev/tcp/127.0.0.1/{loopback.port}) 2>&1 && echo reached || true")
        assert "reached" not in direct.stdout
    finally:
        sbx.kill()
        loop.call_soon_threadsafe(listener.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    assert loopback.connections == 0  # listening on every address of the host: the sandbox reached none
