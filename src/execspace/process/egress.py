"""The egress proxy: a run's only way out when its network is a :class:`~execspace.models.NetworkPolicy`.

It runs on the host, outside the sandbox, and serves one listening socket (the sandbox's ``127.0.0.1:PORT``, handed
over by the sandbox's bridge, or any socket a test gives it). Each connection speaks HTTP ``CONNECT``, plain HTTP
proxying (absolute-URI requests) or SOCKS5 (``CONNECT`` with a name or address). Every destination is judged on its
name first (deny entries win, then allow entries), then the proxy resolves the name itself, refuses any address that
is not public unless the policy names it (a ``resolve`` pin, an address entry), and connects only to an address it
checked. What the client sends is parsed strictly (:mod:`.egresswire`: a malformed or ambiguous request is refused);
plain HTTP must carry a ``Host`` header naming the target; a TLS ClientHello through a tunnel, reassembled whole,
must name the target in its SNI. Every attempt is recorded (:class:`~execspace.models.NetworkAttempt`).

A host with injection rules (``NetworkPolicy.inject``) is served by :mod:`.egressinject`: its plain HTTP request
and, in a tunnel, its TLS (ended with the sandbox's CA, :mod:`.egressca`) are read request by request and get the
rules' headers; every other tunnel is copied as it is, never read.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import ipaddress
import json
import os
import socket
import ssl
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ..models import HeaderInjection, NetworkApprover, NetworkAttempt, NetworkPolicy, RunResult
from ..workspace.confine import ConfinedRoot, split_relpath
from .egressinject import (
    HOP_HEADERS,
    Injections,
    Refused,
    RequestPlan,
    SocketStream,
    Stream,
    TlsStream,
    forward_requests,
    make_ca,
    relay,
    upstream_context,
)
from .egresswire import (
    ClientHelloReader,
    HeadReader,
    HttpRequest,
    Incomplete,
    Malformed,
    http_request,
    socks5_methods,
    socks5_request,
    target_host,
)

if TYPE_CHECKING:
    from .egressca import EgressCA

__all__ = [
    "ANY_PORT",
    "AUDIT_FILE",
    "MAX_CONNECTIONS",
    "EgressProxy",
    "EgressRules",
    "RunAudit",
    "audit_line",
    "listen_in_netns",
    "proxy_env",
    "receive_listener",
    "split_target",
    "without_secrets",
]

#: The audit's file name in the run's directory.
AUDIT_FILE = "network.jsonl"

#: Connections one run may have open through its proxy at once; more are refused (and audited).
MAX_CONNECTIONS = 64
#: Attempts kept in one run's audit; later ones are counted in ``EgressProxy.dropped`` only.
MAX_AUDIT = 10_000
#: Seconds a client has to send its request (HTTP headers, SOCKS5 negotiation) and the proxy to connect.
REQUEST_TIMEOUT = 10.0
CONNECT_TIMEOUT = 10.0
#: Seconds an approval flow (``approve``) may take to answer; no answer refuses.
APPROVAL_TIMEOUT = 120.0
_CHUNK = 256 * 1024
#: Ports an entry without ``:PORT`` allows.
DEFAULT_PORTS = (80, 443)
#: The port of an entry written ``HOST:*``: every port.
ANY_PORT = 0

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_T = TypeVar("_T")


class _Denied(Exception):
    """A destination the policy refuses; the text is the audit's reason."""


class _Unlisted(_Denied):
    """A destination the policy does not list (not one it denies): an approval flow may still let it through."""


def _address(host: str) -> Address | None:
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def split_target(text: str, *, entry: bool = False) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]:port`` as a lower-case (host, port); raises ``ValueError``. An ``entry`` of a
    policy may also be a network (``10.0.0.0/8``) and have the port ``*`` (every port: :data:`ANY_PORT`)."""
    text = text.strip().lower()
    port: str | None = None
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ValueError(text)
            port = rest[1:]
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host = text
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536) and not (entry and port == "*"):
        raise ValueError(text)
    host = host.rstrip(".")
    if not host or any(c.isspace() or c in ("@\\?#%" if entry else "/@\\?#%") for c in host):
        raise ValueError(text)
    return host, None if port is None else ANY_PORT if port == "*" else int(port)


@dataclass(frozen=True, slots=True)
class _Entry:
    text: str
    host: str
    port: int | None
    """None: the entry names no port; :data:`ANY_PORT`: every port."""
    network: Network | None
    """The addresses the entry names (one for an address), None for a name."""

    def matches(self, host: str, port: int, addr: Address | None, *, ports: tuple[int, ...] | None) -> bool:
        """Whether ``host:port`` is this entry's; ``ports``: those an entry without a port covers (None: all)."""
        if self.port is None and ports is not None and port not in ports:
            return False
        if self.port not in (None, ANY_PORT, port):
            return False
        return self.names(host, addr)

    def names(self, host: str, addr: Address | None) -> bool:
        if self.host == "*":  # every destination (an address still has to be public, see _check_address)
            return True
        if self.network is not None or addr is not None:
            return addr is not None and self.network is not None and addr in self.network
        if self.host.startswith("*."):
            return host.endswith(self.host[1:])
        return self.host == host


def _entry(text: str) -> _Entry:
    host, port = split_target(text, entry=True)
    addr = _address(host)
    if addr is not None:
        return _Entry(text, host, port, ipaddress.ip_network(addr))
    if "/" in host:
        return _Entry(text, host, port, ipaddress.ip_network(host, strict=False))
    return _Entry(text, host, port, None)


class EgressRules:
    """A :class:`NetworkPolicy` compiled for judging destinations."""

    def __init__(self, policy: NetworkPolicy) -> None:
        self.policy = policy
        self._allow = [_entry(e) for e in policy.allowed]
        self._deny = [_entry(e) for e in policy.denied]
        self._pins: dict[str, Address] = {}
        for name, value in policy.resolve.items():
            pinned = _address(value)
            assert pinned is not None  # NetworkPolicy checked it
            self._pins[split_target(name)[0]] = pinned
        self._explicit = [e.network for e in self._allow if e.network is not None]

    def judge_name(self, host: str, port: int) -> str:
        """The allow entry that lets ``host:port`` through; raises :class:`_Denied` with the reason."""
        addr = _address(host)
        for entry in self._deny:
            if entry.matches(host, port, addr, ports=None):
                raise _Denied(f"denied by {entry.text!r}")
        for entry in self._allow:
            if entry.matches(host, port, addr, ports=DEFAULT_PORTS):
                return f"allowed by {entry.text!r}"
        if addr is not None:
            raise _Unlisted(f"address {host} is not on the allow-list (only names are, unless an address is listed)")
        if any(e.names(host, None) for e in self._allow):
            raise _Unlisted(f"port {port} of {host} is not allowed (an entry without :PORT allows 80 and 443)")
        raise _Unlisted(f"{host} is not on the allow-list")

    async def resolve(self, host: str, port: int) -> list[Address]:
        """The checked addresses of ``host``: its pin, itself for an address, else every address DNS gives, each of
        which must be public unless the policy names it; raises :class:`_Denied`."""
        literal = _address(host)
        if literal is not None:  # listed (then explicit), or approved by a flow that does not lift this check
            self._check_address(host, literal)
            return [literal]
        if host in self._pins:
            self._check_denied(host, port, self._pins[host])
            return [self._pins[host]]
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError) as exc:
            raise _Denied(f"{host} does not resolve: {exc}") from None
        found: list[Address] = []
        for info in infos:
            addr = _address(str(info[4][0]))
            if addr is not None and addr not in found:
                found.append(addr)
        for addr in found:
            self._check_denied(host, port, addr)
            self._check_address(host, addr)
        if not found:
            raise _Denied(f"{host} has no address")
        return found

    def _check_denied(self, host: str, port: int, addr: Address) -> None:
        """A name's address in a denied network is denied, as the address itself would be."""
        for entry in self._deny:
            if entry.network is not None and entry.matches(host, port, addr, ports=None):
                raise _Denied(f"{host} resolves to {addr}, denied by {entry.text!r}")

    def _check_address(self, host: str, addr: Address) -> None:
        if any(addr in network for network in self._explicit):
            return
        if not addr.is_global or addr.is_multicast:
            raise _Denied(
                f"{host} resolves to {addr}, which is not a public address (loopback, private, link-local, "
                "metadata…): pin it with resolve or list the address to allow it"
            )


class _Socket:
    """A non-blocking socket read and written through the loop: buffered reads for the request, raw for the
    tunnel (``recv_into`` a fixed buffer and ``sendall`` of a view of it: no copy in between)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.buffer = bytearray()

    async def fill(self) -> None:
        data = await self.loop.sock_recv(self.sock, 65536)
        if not data:
            raise EOFError
        self.buffer += data

    async def parse(self, parser: Callable[[bytearray], _T]) -> _T:
        """What ``parser`` makes of the buffer, read on until it has a whole message (raises ``EOFError`` when the
        client ends first; :class:`Malformed` as the parser does)."""
        while True:
            try:
                return parser(self.buffer)
            except Incomplete:
                await self.fill()

    async def send(self, data: bytes | memoryview) -> None:
        await self.loop.sock_sendall(self.sock, data)

    def close(self) -> None:
        self.sock.close()


@dataclass(slots=True)
class _Conn:
    """One client connection: its attempt (filled in as it is judged) and its sockets."""

    client: _Socket
    record: dict[str, object] = field(default_factory=dict)
    upstream: _Socket | None = None
    done: bool = False
    deadline: asyncio.Timeout | None = None
    """The request's deadline: lifted once it is read (resolving, connecting, approving have their own)."""


class EgressProxy:
    """One run's proxy: serves a listening socket until :meth:`close`, judging every connection by ``policy``."""

    def __init__(
        self,
        policy: NetworkPolicy,
        run_id: str,
        *,
        on_record: Callable[[NetworkAttempt], None] | None = None,
        max_connections: int = MAX_CONNECTIONS,
        approve: NetworkApprover | None = None,
        request_timeout: float = REQUEST_TIMEOUT,
        ca: EgressCA | None = None,
    ) -> None:
        self.rules = EgressRules(policy)
        self.injections = Injections(policy.inject)
        #: The CA whose certificates end a program's TLS to an injected host (the one its sandbox trusts; made
        #: here when the caller gives none and the policy injects).
        self.ca = ca if ca is not None or not policy.inject else make_ca(self.injections.hosts, "egress proxy")
        self._upstream_tls: ssl.SSLContext | None = None
        self.request_timeout = request_timeout
        self.approve = approve
        self._approvals: dict[tuple[str, int], asyncio.Task[bool]] = {}
        self.run_id = run_id
        self.on_record = on_record
        self.max_connections = max_connections
        self.dropped = 0
        self._records: list[NetworkAttempt] = []
        self._live: dict[asyncio.Task[None], _Conn] = {}
        self._accepting: asyncio.Task[None] | None = None
        self._closed = False

    async def serve(self, listener: socket.socket) -> None:
        """Accept connections on ``listener`` (a listening TCP socket, taken over) until :meth:`close`."""
        listener.setblocking(False)
        if self._closed:
            listener.close()
            return
        self._accepting = asyncio.get_running_loop().create_task(self._accept(listener))

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                sock, _ = await loop.sock_accept(listener)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                task = loop.create_task(self._client(_Socket(sock)))
                task.add_done_callback(lambda done: self._live.pop(done, None))
        finally:
            listener.close()

    def audit(self) -> tuple[NetworkAttempt, ...]:
        """Every attempt so far, in the order they were asked (open ones with their bytes so far)."""
        live = [self._attempt(c.record) for c in self._live.values() if c.record and not c.done]
        return tuple(sorted([*self._records, *live], key=lambda a: a.time))

    def close(self) -> None:
        """Stop serving and cut every open connection; their attempts are recorded with the bytes they moved."""
        self._closed = True
        if self._accepting is not None:
            self._accepting.cancel()
        for asked in self._approvals.values():
            asked.cancel()
        for task, conn in list(self._live.items()):
            self._finish(conn)
            task.cancel()  # its sockets are closed as it ends

    # -- one connection ----------------------------------------------------------------------

    async def _client(self, client: _Socket) -> None:
        task = asyncio.current_task()
        assert task is not None
        conn = _Conn(client)
        if self._closed or len(self._live) >= self.max_connections:
            conn.record = self._new()
            conn.record.update(allowed=False, reason=f"too many connections: at most {self.max_connections} open")
            self._finish(conn)
            client.close()
            return
        self._live[task] = conn
        try:
            async with asyncio.timeout(self.request_timeout) as conn.deadline:
                await client.fill()
                conn.record = self._new()
                if client.buffer[:1] == b"\x05":
                    tunnel = await self._socks5(conn)
                else:
                    tunnel = await self._http(conn)
            if tunnel is not None and tunnel.rules:
                await self._serve_injected(conn, tunnel)
            elif tunnel is not None:
                await self._pipe(conn, tunnel.upstream, tunnel.host)
        except (OSError, EOFError, TimeoutError) as exc:
            if conn.record and not conn.record["reason"]:  # it ended before its request was judged
                conn.record["reason"] = (
                    f"no complete request within {self.request_timeout:g} s"
                    if isinstance(exc, TimeoutError)
                    else "the connection ended before its request was complete"
                )
        finally:
            self._finish(conn)
            for side in (client, conn.upstream):
                if side is not None:
                    side.close()

    def _new(self) -> dict[str, object]:
        """A new attempt: what it asked for is filled in as it is parsed."""
        return {
            "run_id": self.run_id,
            "time": time.time(),
            "host": "",
            "port": 0,
            "protocol": "unknown",
            "method": "",
            "allowed": False,
            "reason": "",
            "address": "",
            "bytes_up": 0,
            "bytes_down": 0,
        }

    @staticmethod
    def _attempt(record: dict[str, object]) -> NetworkAttempt:
        return NetworkAttempt(**record)  # type: ignore[arg-type]

    def _finish(self, conn: _Conn) -> None:
        if conn.done or not conn.record:
            return
        conn.done = True
        attempt = self._attempt(conn.record)
        if len(self._records) >= MAX_AUDIT:
            self.dropped += 1
            return
        self._records.append(attempt)
        if self.on_record is not None:
            self.on_record(attempt)

    async def _open(self, conn: _Conn, host: str, port: int) -> _Socket:
        """Judge ``host:port`` and connect to one of its checked addresses; raises :class:`_Denied`."""
        if conn.deadline is not None:
            conn.deadline.reschedule(None)
        try:
            conn.record["reason"] = self.rules.judge_name(host, port)
        except _Unlisted as exc:
            if self.approve is None:
                raise
            conn.record["reason"] = await self._approved(conn, host, port, str(exc))
        addresses = await self.rules.resolve(host, port)
        loop = asyncio.get_running_loop()
        last: Exception | None = None
        for addr in addresses:
            sock = socket.socket(socket.AF_INET6 if addr.version == 6 else socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    await loop.sock_connect(sock, (str(addr), port))
            except (OSError, TimeoutError) as exc:
                sock.close()
                last = exc
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.upstream = _Socket(sock)
            conn.record.update(allowed=True, address=str(addr))
            return conn.upstream
        raise ConnectionError(f"cannot connect to {host}:{port}: {last}")

    async def _approved(self, conn: _Conn, host: str, port: int, reason: str) -> str:
        """Ask the approval flow about an unlisted destination (once per host and port); raises :class:`_Denied`."""
        key = (host, port)
        asked = self._approvals.get(key)
        if asked is None:
            attempt = self._attempt({**conn.record, "allowed": False, "reason": reason})
            asked = self._approvals[key] = asyncio.get_running_loop().create_task(self._ask(attempt))
        if await asyncio.shield(asked):
            return "approved by on_network_attempt"
        raise _Denied(f"{reason}; on_network_attempt did not approve it")

    async def _ask(self, attempt: NetworkAttempt) -> bool:
        assert self.approve is not None
        try:
            async with asyncio.timeout(APPROVAL_TIMEOUT):
                return await self.approve(attempt) is True
        except Exception:  # the caller's flow failing refuses, as no answer (the timeout) does
            return False

    # -- HTTP ----------------------------------------------------------------------------------

    async def _http(self, conn: _Conn) -> _Tunnel | None:
        client = conn.client
        try:
            end = await client.parse(HeadReader().end)
            request = http_request(bytes(client.buffer[:end]))
        except Malformed as exc:
            conn.record["protocol"] = "connect" if client.buffer.startswith(b"CONNECT ") else "http"
            await self._refuse(conn, 400, f"malformed HTTP request: {exc}")
            return None
        head = bytes(client.buffer[:end])
        del client.buffer[:end]
        connect = request.method == "CONNECT"
        conn.record.update(protocol="connect" if connect else "http", method=request.method, host=request.target)
        if connect:
            return await self._connect_method(conn, request.target)
        return await self._forward(conn, request, head)

    async def _connect_method(self, conn: _Conn, target: str) -> _Tunnel | None:
        try:
            host, port = _authority(target)
            if port is None:
                raise Malformed("CONNECT needs HOST:PORT")
            conn.record.update(host=host, port=port)
            upstream = await self._open(conn, host, port)
        except _Denied as exc:
            await self._refuse(conn, 403, str(exc))
            return None
        except Malformed as exc:
            await self._refuse(conn, 400, f"malformed CONNECT target {target!r}: {exc}")
            return None
        except ConnectionError as exc:
            await self._refuse(conn, 502, str(exc), denied=False)
            return None
        await conn.client.send(b"HTTP/1.1 200 Connection established\r\n\r\n")
        return _Tunnel(upstream, host, port, self.injections.for_host(host))

    async def _forward(self, conn: _Conn, request: HttpRequest, head: bytes) -> _Tunnel | None:
        scheme, sep, rest = request.target.partition("://")
        if not sep or scheme.lower() != "http":
            await self._refuse(conn, 400, "a proxy request needs an absolute http:// URI (CONNECT for https)")
            return None
        authority, _, path = rest.partition("/")
        try:
            if "@" in authority:
                raise Malformed("user information in the request target")
            host, port = _authority(authority)
            port = port or 80
            conn.record.update(host=host, port=port)
            named = request.header("host")
            if named is None or _authority(named, default_port=80) != (host, port):
                raise _Denied(f"the Host header {named!r} does not name the request's target {host}:{port}")
            upstream = await self._open(conn, host, port)
        except _Denied as exc:
            await self._refuse(conn, 403, str(exc))
            return None
        except Malformed as exc:
            await self._refuse(conn, 400, f"malformed request target {request.target!r}: {exc}")
            return None
        except ConnectionError as exc:
            await self._refuse(conn, 502, str(exc), denied=False)
            return None
        rules = self.injections.for_host(host)
        if rules:  # read again as the injected host's one request: head and body, nothing after
            conn.client.buffer[:0] = head
            return _Tunnel(upstream, None, port, rules, proxy_form=True)
        kept = [f"{name}: {value}" for name, value in request.headers if name.lower() not in HOP_HEADERS]
        line = f"{request.method} /{path} HTTP/{request.version}"
        data = "\r\n".join([line, *kept, "Connection: close", "", ""]).encode("latin-1")
        await upstream.send(data)
        conn.record["bytes_up"] = len(data)
        return _Tunnel(upstream, None, port)

    async def _refuse(self, conn: _Conn, status: int, reason: str, *, denied: bool = True) -> None:
        conn.record.update(allowed=False, reason=reason if denied else f"allowed, but {reason}")
        body = f"execspace egress: {reason}\n".encode()
        titles = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}
        head = f"HTTP/1.1 {status} {titles[status]}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        with contextlib.suppress(OSError):
            await conn.client.send(f"{head}Connection: close\r\n\r\n".encode() + body)

    # -- SOCKS5 --------------------------------------------------------------------------------

    async def _socks5(self, conn: _Conn) -> _Tunnel | None:
        conn.record["protocol"] = "socks5"
        client = conn.client
        try:
            methods, used = await client.parse(socks5_methods)
        except Malformed as exc:
            await client.send(b"\x05\xff")
            conn.record["reason"] = f"malformed SOCKS5 greeting: {exc}"
            return None
        del client.buffer[:used]
        if 0 not in methods:
            await client.send(b"\x05\xff")
            conn.record["reason"] = "SOCKS5 without the no-authentication method"
            return None
        await client.send(b"\x05\x00")
        try:
            request, used = await client.parse(socks5_request)
        except Malformed as exc:
            await client.send(_socks_reply(1))
            conn.record["reason"] = f"malformed SOCKS5 request: {exc}"
            return None
        del client.buffer[:used]
        host, port = request.host, request.port
        conn.record.update(
            host=host, port=port, method="CONNECT" if request.command == 1 else f"command {request.command}"
        )
        if request.command != 1:
            await client.send(_socks_reply(7))
            conn.record["reason"] = "only SOCKS5 CONNECT is served (no BIND, no UDP)"
            return None
        try:
            upstream = await self._open(conn, host, port)
        except _Denied as exc:
            await client.send(_socks_reply(2))  # connection not allowed by ruleset
            conn.record.update(allowed=False, reason=str(exc))
            return None
        except ConnectionError as exc:
            await client.send(_socks_reply(5))
            conn.record.update(allowed=False, reason=f"allowed, but {exc}")
            return None
        await client.send(_socks_reply(0))
        return _Tunnel(upstream, host, port, self.injections.for_host(host))

    # -- an injected host --------------------------------------------------------------------------

    async def _serve_injected(self, conn: _Conn, tunnel: _Tunnel) -> None:
        """Serve a connection to a host with injection rules request by request: plain HTTP as it is, TLS ended
        with the sandbox's CA and opened anew to the host (verified); answers go back unread."""
        assert tunnel.host is not None or tunnel.proxy_form
        host = tunnel.host or str(conn.record["host"])
        client: Stream = SocketStream(conn.client)
        upstream: Stream = SocketStream(tunnel.upstream)
        default_port = 80
        if not tunnel.proxy_form:
            if not await self._check_sni(conn, host):
                return
            if conn.client.buffer[:1] == b"\x16":
                tls = await self._terminate(conn, tunnel, host)
                if tls is None:
                    return
                client, upstream = tls
                default_port = 443
        names = ", ".join(rule.header for rule in tunnel.rules)
        conn.record["reason"] = f"{conn.record['reason']}; {names} injected" + (
            " (TLS ended by the proxy)" if default_port == 443 else ""
        )
        plan = RequestPlan(host, tunnel.port, default_port, tunnel.rules, proxy_form=tunnel.proxy_form)
        up = asyncio.ensure_future(forward_requests(client, upstream, plan, conn.record))
        down = asyncio.ensure_future(relay(upstream, client, conn.record, "bytes_down"))
        try:
            await asyncio.wait((up, down), return_when=asyncio.FIRST_COMPLETED)
            if up.done() and not up.cancelled() and (exc := up.exception()) is not None:
                await self._refuse_request(conn, client, exc)
                return
            await down
        finally:
            up.cancel()
            down.cancel()

    async def _terminate(self, conn: _Conn, tunnel: _Tunnel, host: str) -> tuple[Stream, Stream] | None:
        """The client's TLS ended with a certificate for ``host`` from the sandbox's CA, and the proxy's own TLS to
        the upstream, verified against the trust store (or the policy's CA); None when either fails (audited)."""
        assert self.ca is not None
        if self._upstream_tls is None:
            self._upstream_tls = upstream_context(self.rules.policy.upstream_ca)
        # minting a host's certificate is a signature and a key load (milliseconds): off the loop other runs share
        context = await asyncio.to_thread(self.ca.server_context, host)
        client = TlsStream(conn.client, context, server_side=True)
        upstream = TlsStream(tunnel.upstream, self._upstream_tls, server_side=False, server_hostname=host)
        try:
            async with asyncio.timeout(self.request_timeout):
                await client.handshake()
        except (ssl.SSLError, EOFError, TimeoutError) as exc:
            conn.record["reason"] = f"{conn.record['reason']}; the program's TLS handshake failed: {_tls_error(exc)}"
            return None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                await upstream.handshake()
        except (ssl.SSLError, EOFError, TimeoutError) as exc:
            reason = f"the TLS of {host}:{tunnel.port} failed: {_tls_error(exc)}"
            conn.record.update(allowed=False, reason=f"allowed, but {reason}")
            await _answer(client, 502, f"execspace egress: {reason}")
            return None
        return client, upstream

    async def _refuse_request(self, conn: _Conn, client: Stream, exc: BaseException) -> None:
        """A request to an injected host that was not forwarded: the client gets a 400 saying why (audited)."""
        if not isinstance(exc, Refused | Malformed):
            raise exc
        reason = f"a request was refused: {exc}"
        conn.record["reason"] = f"{conn.record['reason']}; {reason}"
        with contextlib.suppress(OSError):
            await _answer(client, 400, f"execspace egress: {reason}")

    # -- the tunnel ------------------------------------------------------------------------------

    async def _pipe(self, conn: _Conn, upstream: _Socket, sni_host: str | None) -> None:
        """Copy both ways until the destination's side ends (or the client's check fails): the first TLS record
        from the client must name ``sni_host``."""

        async def upward() -> bool:
            if sni_host is not None and not await self._check_sni(conn, sni_host):
                return False
            await _relay(conn.client, upstream, conn.record, "bytes_up")
            return True

        up = asyncio.ensure_future(upward())
        down = asyncio.ensure_future(_relay(upstream, conn.client, conn.record, "bytes_down"))
        try:
            await asyncio.wait((up, down), return_when=asyncio.FIRST_COMPLETED)
            if up.done() and (up.cancelled() or up.exception() is not None or not up.result()):
                return
            await down
        finally:
            up.cancel()
            down.cancel()

    async def _check_sni(self, conn: _Conn, host: str) -> bool:
        """Whether the client's first bytes may go on: anything but TLS is not inspected; a TLS ClientHello is
        reassembled whole (within the request timeout and :data:`MAX_CLIENT_HELLO`) and must name ``host`` or no
        name at all; an incomplete or malformed one is refused."""
        client = conn.client
        if not client.buffer:
            with contextlib.suppress(EOFError):
                await client.fill()
        if client.buffer[:1] != b"\x16":
            return True
        try:
            async with asyncio.timeout(self.request_timeout):
                name = await client.parse(ClientHelloReader().server_name)
        except Malformed as exc:
            reason = f"malformed TLS ClientHello: {exc}"
        except EOFError:
            reason = "the TLS ClientHello ended before it was complete"
        except TimeoutError:
            reason = f"the TLS ClientHello was not complete within {self.request_timeout:g} s"
        else:
            if name is None or name == host:
                return True
            reason = f"the TLS SNI {name!r} differs from the target {host!r}"
        conn.record.update(allowed=False, reason=reason)
        return False


@dataclass(frozen=True, slots=True)
class _Tunnel:
    """An accepted request's upstream, and how the client's bytes go to it."""

    upstream: _Socket
    host: str | None
    """The name the client's TLS must give (None: not checked)."""
    port: int
    rules: tuple[HeaderInjection, ...] = ()
    """The host's injection rules: its requests are read and rewritten (none: the bytes are copied unread)."""
    proxy_form: bool = False
    """A plain HTTP request to the proxy (else a tunnel)."""


async def _answer(client: Stream, status: int, text: str) -> None:
    body = f"{text}\n".encode()
    title = {400: "Bad Request", 502: "Bad Gateway"}[status]
    head = f"HTTP/1.1 {status} {title}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
    await client.write(f"{head}Connection: close\r\n\r\n".encode() + body)
    client.end()


def _tls_error(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed ({exc.verify_message})"
    if isinstance(exc, TimeoutError):
        return "no handshake in time"
    if isinstance(exc, EOFError):
        return "the connection ended during the handshake"
    return str(getattr(exc, "reason", None) or exc)[:200]


def _socks_reply(code: int) -> bytes:
    return bytes([5, code, 0, 1, 0, 0, 0, 0, 0, 0])


def _authority(text: str, default_port: int | None = None) -> tuple[str, int | None]:
    """``host[:port]`` of a request target or ``Host`` header as the proxy judges it; raises :class:`Malformed`."""
    try:
        host, port = split_target(text)
    except ValueError:
        raise Malformed(f"{text!r} is not HOST or HOST:PORT") from None
    return target_host(host), default_port if port is None else port


async def _relay(src: _Socket, dst: _Socket, record: dict[str, object], key: str) -> None:
    if src.buffer:
        data = bytes(src.buffer)
        src.buffer.clear()
        await dst.send(data)
        record[key] = int(record[key]) + len(data)  # type: ignore[call-overload]
    if hasattr(os, "splice"):
        await _splice(src, dst, record, key)
    else:
        buffer = bytearray(_CHUNK)
        view = memoryview(buffer)
        while n := await src.loop.sock_recv_into(src.sock, buffer):
            await dst.send(view[:n])
            record[key] = int(record[key]) + n  # type: ignore[call-overload]
    with contextlib.suppress(OSError):
        dst.sock.shutdown(socket.SHUT_WR)


async def _splice(src: _Socket, dst: _Socket, record: dict[str, object], key: str) -> None:
    """Move the bytes socket to pipe to socket in the kernel (Linux): the proxy never copies them."""
    flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
    pipe_r, pipe_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    with contextlib.suppress(OSError):  # a pipe of 64 KiB moves a quarter of a chunk per call
        fcntl.fcntl(pipe_w, fcntl.F_SETPIPE_SZ, _CHUNK)
    try:
        while True:
            try:
                n = os.splice(src.sock.fileno(), pipe_w, _CHUNK, flags=flags)
            except BlockingIOError:
                await _ready(src.loop, src.sock.fileno(), write=False)
                continue
            if n == 0:
                return
            left = n
            while left:
                try:
                    left -= os.splice(pipe_r, dst.sock.fileno(), left, flags=flags)
                except BlockingIOError:
                    await _ready(dst.loop, dst.sock.fileno(), write=True)
            record[key] = int(record[key]) + n  # type: ignore[call-overload]
    finally:
        os.close(pipe_r)
        os.close(pipe_w)


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, *, write: bool) -> None:
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, wake)
    try:
        await ready
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


async def receive_listener(channel: socket.socket) -> socket.socket:
    """The listening TCP socket the sandbox's bridge sends over ``channel`` (its end of a socketpair) before it
    starts the program (waits until it comes: bound it with ``asyncio.timeout``); raises ``ConnectionError`` when
    the bridge sends none or it is not a listening TCP socket."""
    loop = asyncio.get_running_loop()
    channel.setblocking(False)
    ready: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(channel.fileno(), readable)
    try:
        await ready
    finally:
        loop.remove_reader(channel.fileno())
    _, fds, _, _ = socket.recv_fds(channel, 16, 4)
    for extra in fds[1:]:
        os.close(extra)
    if not fds:
        raise ConnectionError("the sandbox's egress bridge sent no socket")
    if not stat.S_ISSOCK(os.fstat(fds[0]).st_mode):
        os.close(fds[0])
        raise ConnectionError("the sandbox's egress bridge sent something that is not a socket")
    sock = socket.socket(fileno=fds[0])
    if (
        sock.family != socket.AF_INET
        or sock.type != socket.SOCK_STREAM
        or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    ):
        sock.close()
        raise ConnectionError("the sandbox's egress bridge sent a socket that is not a listening TCP socket")
    return sock


def audit_line(attempt: NetworkAttempt) -> bytes:
    """One attempt as a line of the run's ``network.jsonl``."""
    return json.dumps(attempt.as_dict(), separators=(",", ":")).encode() + b"\n"


def without_secrets(env: Mapping[str, str], policy: NetworkPolicy) -> dict[str, str]:
    """``env`` less every variable whose value holds one of ``policy``'s injected values (a variable the caller's
    environment passed on, ``env:VAR`` itself): what the proxy adds for the program, the program never holds."""
    secrets = [rule.value.reveal() for rule in policy.inject]
    if not secrets:
        return dict(env)
    return {name: value for name, value in env.items() if not any(secret in value for secret in secrets)}


def proxy_env(port: int) -> dict[str, str]:
    """Proxy settings for a program whose proxy listens on ``127.0.0.1:port`` of its own loopback: its HTTP
    clients, pip, npm and git (both cases where tools differ)."""
    http = f"http://127.0.0.1:{port}"
    env = {
        "HTTP_PROXY": http,
        "HTTPS_PROXY": http,
        # socks5h: the proxy resolves names (the program has no DNS)
        "ALL_PROXY": f"socks5h://127.0.0.1:{port}",
        "NO_PROXY": "",
        "PIP_PROXY": http,
        "npm_config_proxy": http,
        "npm_config_https_proxy": http,
        "GIT_CONFIG_COUNT": "2",
        "GIT_CONFIG_KEY_0": "http.proxy",
        "GIT_CONFIG_VALUE_0": http,
        "GIT_CONFIG_KEY_1": "https.proxy",
        "GIT_CONFIG_VALUE_1": http,
    }
    env.update({key.lower(): value for key, value in env.items() if key.endswith("_PROXY")})
    return env


class RunAudit:
    """One run's proxy and its audit: every attempt is appended to ``network.jsonl`` in the run's directory and
    returned in its result (:meth:`annotate`). Serve it on a listener with ``proxy.serve``; :meth:`close` when the
    run is over (its open connections are cut and audited)."""

    def __init__(
        self,
        policy: NetworkPolicy,
        root: Path,
        run_dir: str,
        approve: NetworkApprover | None = None,
        ca: EgressCA | None = None,
    ) -> None:
        self._audit_fd = _open_audit(root, run_dir)
        self.proxy = EgressProxy(policy, Path(run_dir).name, on_record=self._write, approve=approve, ca=ca)

    def close(self) -> None:
        self.proxy.close()
        os.close(self._audit_fd)

    def annotate(self, result: RunResult) -> RunResult:
        return replace(result, network_audit=self.proxy.audit())

    def _write(self, attempt: NetworkAttempt) -> None:
        with contextlib.suppress(OSError):  # a full disk loses the file's line, not the result's
            os.write(self._audit_fd, audit_line(attempt))


def _open_audit(root: Path, run_dir: str) -> int:
    # through fds pinned from the root: the program may have replaced the run directory by a symlink by now
    with ConfinedRoot(str(root)) as cr:
        dir_fd = cr.open_dir(split_relpath(run_dir))
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(AUDIT_FILE, flags, 0o644, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


_CLONE_NEWNET = 0x40000000


def listen_in_netns(netns_fd: int, backlog: int = MAX_CONNECTIONS) -> socket.socket:
    """A TCP socket listening on a free port of ``127.0.0.1`` in the network namespace ``netns_fd`` (an open
    ``/proc/PID/ns/net``), for a proxy on the host to serve: a socket keeps the namespace it was made in. Needs
    ``CAP_SYS_ADMIN`` over that namespace (root). Raises ``OSError``.

    The switch is made in a thread of its own, which ends with it: no thread of ours is ever left in the other
    namespace (``setns`` moves only the calling thread)."""
    made: list[socket.socket] = []
    failed: list[OSError] = []

    def make() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if libc.setns(netns_fd, _CLONE_NEWNET) != 0:
                errno = ctypes.get_errno()
                raise OSError(errno, f"cannot enter the network namespace: {os.strerror(errno)}")
            try:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    sock.bind(("127.0.0.1", 0))
                    sock.listen(backlog)
                except OSError:
                    sock.close()
                    raise
                made.append(sock)
            finally:
                libc.setns(own, _CLONE_NEWNET)
        except OSError as exc:
            failed.append(exc)
        finally:
            os.close(own)

    thread = threading.Thread(target=make, name="execspace-netns")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]
