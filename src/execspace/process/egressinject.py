"""Credentials the egress proxy adds to a program's HTTP requests (:attr:`~execspace.models.NetworkPolicy.inject`).

For a host with injection rules the proxy reads each request the program sends it (plain HTTP as it forwards it; in
a tunnel, after ending the program's TLS with a certificate of the sandbox's own CA, see :mod:`.egressca`), drops
the program's own headers of the injected names and adds the rule's, then forwards the request's body as h11 frames
it. The upstream's answers go back to the program unread. A request must name the tunnel's host in its ``Host``
(a program cannot send the credential to another site behind the same address) and nothing else is forwarded
between requests: every request to the host carries the header, none carries the program's.

The values are read from :class:`~execspace.models.Secret` only here, as a request is written: they are in no
message, audit line or exception text.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import h11

from ..errors import CapabilityError
from ..models import HeaderInjection
from .egresswire import MAX_HEAD, HeadReader, HttpRequest, Incomplete, Malformed, http_request, target_host

if TYPE_CHECKING:
    from .egressca import EgressCA

__all__ = [
    "HOP_HEADERS",
    "Injections",
    "Refused",
    "RequestPlan",
    "SocketLike",
    "SocketStream",
    "Stream",
    "TlsStream",
    "forward_requests",
    "make_ca",
    "relay",
    "rewritten_head",
    "upstream_context",
]

#: Headers of one connection, never forwarded (the proxy frames each side's connection itself).
HOP_HEADERS = frozenset({"connection", "proxy-connection", "keep-alive", "proxy-authorization", "te", "upgrade"})
_CHUNK = 64 * 1024


def make_ca(hosts: Sequence[str], backend: str) -> EgressCA:
    """A new CA for a sandbox whose injected hosts are ``hosts``; raises :class:`CapabilityError` naming the extra
    when the ``cryptography`` package is not installed (the policy would not be enforced over HTTPS)."""
    if importlib.util.find_spec("cryptography") is None:
        raise CapabilityError(
            "credentials injected by the egress proxy (NetworkPolicy.inject)",
            backend,
            "pip install 'execspace[inject]' (the cryptography package makes the sandbox's CA)",
        )
    from .egressca import EgressCA

    return EgressCA(hosts)


def upstream_context(cafile: Path | None) -> ssl.SSLContext:
    """The TLS client context the proxy reaches an injected host with: verified against this machine's trust store,
    or ``cafile`` alone; HTTP/1.1 only (the proxy reads and writes HTTP/1.1)."""
    context = ssl.create_default_context(cafile=None if cafile is None else str(cafile))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    return context


class Refused(Exception):
    """A request the proxy will not forward to an injected host (the text says why; it holds no header value)."""


@dataclass(frozen=True, slots=True)
class Injections:
    """A policy's rules, looked up by host: a name's exact rules win, then the longest ``*.suffix`` (a host gets
    one host pattern's rules, never a merge of two)."""

    rules: tuple[HeaderInjection, ...]

    def for_host(self, host: str) -> tuple[HeaderInjection, ...]:
        """The rules that apply to ``host`` (a lower-case name or address); empty when none does."""
        best: str | None = None
        for rule in self.rules:
            if rule.covers(host) and (best is None or _rank(rule.host, host) > _rank(best, host)):
                best = rule.host
        return tuple(rule for rule in self.rules if rule.host == best)

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(sorted({rule.host for rule in self.rules}))


def _rank(pattern: str, host: str) -> int:
    """How closely ``pattern`` (which names ``host``) names it: the name itself first, then the longest suffix."""
    return 1 << 16 if pattern == host else len(pattern)


# -- streams -----------------------------------------------------------------------------------------


class SocketLike(Protocol):
    """What the proxy's socket wrapper gives: a non-blocking socket, its loop, bytes read ahead."""

    sock: socket.socket
    loop: asyncio.AbstractEventLoop
    buffer: bytearray

    async def send(self, data: bytes | memoryview) -> None: ...


class Stream(Protocol):
    async def read(self) -> bytes:
        """The next bytes; ``b""`` at the end."""
        ...

    async def write(self, data: bytes) -> None: ...

    def end(self) -> None:
        """No more writes (the peer reads the end)."""
        ...


class SocketStream:
    """A plain connection: what was read ahead first, then the socket."""

    def __init__(self, raw: SocketLike) -> None:
        self.raw = raw

    async def read(self) -> bytes:
        if self.raw.buffer:
            data = bytes(self.raw.buffer)
            self.raw.buffer.clear()
            return data
        return await self.raw.loop.sock_recv(self.raw.sock, _CHUNK)

    async def write(self, data: bytes) -> None:
        await self.raw.send(data)

    def end(self) -> None:
        with contextlib.suppress(OSError):
            self.raw.sock.shutdown(socket.SHUT_WR)


class TlsStream:
    """TLS over a plain connection, through memory BIOs: the proxy's sockets stay its own (no transport), and
    bytes the proxy read ahead (the ClientHello it judged) are the first the TLS reads."""

    def __init__(
        self, raw: SocketLike, context: ssl.SSLContext, *, server_side: bool, server_hostname: str | None = None
    ) -> None:
        self.plain = SocketStream(raw)
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._in, self._out, server_side=server_side, server_hostname=server_hostname)
        # the reading and the writing task both flush what TLS wrote: one at a time, or records interleave
        self._sending = asyncio.Lock()

    async def handshake(self) -> None:
        """Raises ``ssl.SSLError`` (a certificate that does not verify among them) or ``EOFError``."""
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                await self._feed(during_handshake=True)
        await self._flush()

    async def read(self) -> bytes:
        while True:
            try:
                return self._tls.read(_CHUNK)
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._feed():
                    return b""
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            sent = self._tls.write(view)
            view = view[sent:]
            await self._flush()

    def end(self) -> None:
        with contextlib.suppress(ssl.SSLError):
            self._tls.unwrap()  # close_notify, then the plain side ends
        with contextlib.suppress(OSError):
            data = self._out.read()
            if data:
                self.plain.raw.sock.send(data)
        self.plain.end()

    async def _flush(self) -> None:
        async with self._sending:
            data = self._out.read()
            if data:
                await self.plain.write(data)

    async def _feed(self, *, during_handshake: bool = False) -> bool:
        data = await self.plain.read()
        if not data:
            if during_handshake:
                raise EOFError
            self._in.write_eof()
            return False
        self._in.write(data)
        return True


async def relay(src: Stream, dst: Stream, record: dict[str, object], key: str) -> None:
    """Copy ``src`` to ``dst`` as it comes (an upstream's answers), then end ``dst``."""
    while data := await src.read():
        await dst.write(data)
        record[key] = int(record[key]) + len(data)  # type: ignore[call-overload]
    dst.end()


# -- requests ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """How the requests of one connection to an injected host are read and written."""

    host: str
    port: int
    default_port: int
    """The port a ``Host`` without one means: 443 in TLS, else 80."""
    rules: tuple[HeaderInjection, ...]
    proxy_form: bool = False
    """Plain HTTP to the proxy: one request, its target an absolute ``http://`` URI (else origin form, many)."""


def rewritten_head(request: HttpRequest, target: str, rules: Sequence[HeaderInjection], *, close: bool) -> bytes:
    """``request``'s head for the upstream: origin-form ``target``, its headers but the hop-by-hop ones and the
    injected names, then the injected headers."""
    names = {rule.header.lower() for rule in rules}
    kept = [f"{name}: {value}" for name, value in request.headers if name.lower() not in HOP_HEADERS | names]
    added = [f"{rule.header}: {rule.value.reveal()}" for rule in rules]
    line = f"{request.method} {target} HTTP/{request.version}"
    ending = ["Connection: close"] if close else []
    return "\r\n".join([line, *kept, *added, *ending, "", ""]).encode("latin-1")


async def forward_requests(client: Stream, upstream: Stream, plan: RequestPlan, record: dict[str, object]) -> None:
    """Forward the client's requests to ``upstream`` one at a time, each rewritten (:func:`rewritten_head`) and its
    body as h11 frames it, until the client ends (or, in proxy form, after the first). Raises :class:`Refused` or
    :class:`Malformed` before anything of an offending request is forwarded."""
    pending = bytearray()
    while True:
        head_end = await _read_head(client, pending)
        if head_end is None:
            upstream.end()
            return
        request = http_request(bytes(pending[:head_end]))
        target = _target(request, plan)
        tokens = {token.strip().lower() for token in (request.header("connection") or "").split(",")}
        close = plan.proxy_form or "close" in tokens
        head = rewritten_head(request, target, plan.rules, close=close)
        await upstream.write(head)
        record["bytes_up"] = int(record["bytes_up"]) + len(head)  # type: ignore[call-overload]
        pending = await _forward_body(client, upstream, pending, record)
        if close:
            return  # the upstream answers and closes: nothing more of the client's goes to it


async def _read_head(client: Stream, pending: bytearray) -> int | None:
    """The length of the request head at the start of ``pending``, read on as needed; None when the client ended
    between requests. Raises :class:`Malformed` (a head cut short among them)."""
    reader = HeadReader()
    while True:
        try:
            return reader.end(pending)
        except Incomplete:
            data = await client.read()
            if not data:
                if pending:
                    raise Malformed("the connection ended inside a request head") from None
                return None
            pending += data


def _target(request: HttpRequest, plan: RequestPlan) -> str:
    """The origin-form target to forward; raises :class:`Refused` for a request that does not name the plan's host
    and port (its ``Host``, and in proxy form its URI) or that asks for another kind of connection."""
    if request.method == "CONNECT":
        raise Refused("CONNECT inside a connection to an injected host")
    target = request.target
    if plan.proxy_form:
        scheme, sep, rest = target.partition("://")
        authority, _, path = rest.partition("/")
        if not sep or scheme.lower() != "http" or _authority(authority, 80) != (plan.host, plan.port):
            raise Refused(f"the request's target is not http://{plan.host}:{plan.port}/")
        target = "/" + path
    elif not target.startswith("/"):
        raise Refused("a request in a tunnel needs an origin-form target (/path)")
    named = request.header("host")
    if named is None or _authority(named, plan.default_port) != (plan.host, plan.port):
        raise Refused(f"the Host header does not name {plan.host}:{plan.port}")
    return target


def _authority(text: str, default_port: int) -> tuple[str, int] | None:
    """``name[:port]`` as (host, port); None for anything else (an injected host is a name, never an address)."""
    host, sep, port = text.partition(":")
    if sep and not (port.isdigit() and 0 < int(port) < 65536):
        return None
    try:
        return target_host(host), int(port) if sep else default_port
    except Malformed:
        return None


async def _forward_body(client: Stream, upstream: Stream, pending: bytearray, record: dict[str, object]) -> bytearray:
    """Forward the body of the request whose head starts ``pending`` (``Content-Length`` bytes as they are, a
    chunked body chunk by chunk as h11 decodes it); returns what the client sent after it."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    conn.receive_data(bytes(pending))
    chunked = False
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise Malformed(str(exc)[:200]) from None
        if event is h11.NEED_DATA:
            data = await client.read()
            conn.receive_data(data)
            if not data:
                raise Malformed("the connection ended inside a request body")
            continue
        if isinstance(event, h11.Request):
            chunked = any(name == b"transfer-encoding" for name, _ in event.headers)
            continue
        if isinstance(event, h11.Data):
            data = bytes(event.data)
            out = b"%x\r\n%b\r\n" % (len(data), data) if chunked else data
        elif isinstance(event, h11.EndOfMessage):
            trailers = b"".join(b"%b: %b\r\n" % (name, value) for name, value in event.headers.raw_items())
            out = b"0\r\n%b\r\n" % trailers if chunked else b""
        else:
            raise Malformed(f"unexpected {type(event).__name__} in a request")
        if out:
            await upstream.write(out)
            record["bytes_up"] = int(record["bytes_up"]) + len(out)  # type: ignore[call-overload]
        if isinstance(event, h11.EndOfMessage):
            return bytearray(conn.trailing_data[0])
