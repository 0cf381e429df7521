"""What a sandbox sends its egress proxy, parsed strictly: an HTTP request head, a SOCKS5 negotiation, a TLS
ClientHello.

Every parser here reads bytes a hostile program chose. Each either gives a fully parsed value, raises
:class:`Incomplete` (the bytes so far end before the message does: read more, within the proxy's bounds), or raises
:class:`Malformed` saying what is wrong; nothing else. A message that two readers could read two ways (a bare CR or
LF, an obs-folded header, two ``Host`` headers, a body framed twice, a ClientHello split so that its first record
holds no server name) is malformed, never guessed at: the proxy judges exactly what the destination will read.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

import h11

__all__ = [
    "MAX_CLIENT_HELLO",
    "MAX_HEAD",
    "ClientHelloReader",
    "HeadReader",
    "HttpRequest",
    "Incomplete",
    "Malformed",
    "Socks5Request",
    "client_hello_sni",
    "http_request",
    "socks5_methods",
    "socks5_request",
    "target_host",
]

#: Largest HTTP request head (request line and headers) the proxy reads.
MAX_HEAD = 32 * 1024
#: Largest ClientHello (its handshake message, as declared) the proxy reassembles; a real one is under 4 KiB.
MAX_CLIENT_HELLO = 64 * 1024
#: Record bytes (headers included) a ClientHello may be spread over: bounds a hello cut into tiny records.
_MAX_HELLO_RECORDS_BYTES = 2 * MAX_CLIENT_HELLO
_MAX_RECORD = 16384  # TLSPlaintext.length (RFC 8446 5.1)
_HANDSHAKE, _CLIENT_HELLO, _SERVER_NAME, _HOST_NAME = 0x16, 0x01, 0x0000, 0x00

_LABEL = re.compile(rb"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")
#: Bytes no request line or header line may hold (HT is allowed: it is whitespace in a header value).
_LEGACY_NUMBER = re.compile(rb"[0-9]+|0x[0-9a-f]*")
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


class Incomplete(Exception):
    """The bytes so far end before the message does."""


class Malformed(ValueError):
    """Not a well-formed message (the text says what is wrong)."""


def target_host(text: str | bytes) -> str:
    """A destination's host as the proxy judges it: an address in its canonical form (brackets around IPv6
    allowed) or a lower-case DNS name (letters, digits, ``-``, ``_``; no trailing dot, not a number: a resolver
    would read ``127.1`` as an address). Raises :class:`Malformed`."""
    raw = text.encode("latin-1") if isinstance(text, str) else bytes(text)
    try:
        host = raw.decode("ascii").lower()
    except UnicodeDecodeError:
        raise Malformed(f"the host {raw!r} is not ASCII") from None
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        addr = ipaddress.ip_address(bare)
    except ValueError:
        pass
    else:
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            return f"::ffff:{addr.ipv4_mapped}"  # as written (Python before 3.13 writes it ::ffff:7f00:1)
        return str(addr)
    name = host.removesuffix(".").encode()
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(b".")):
        raise Malformed(f"{host!r} is not a host name or an address")
    if _LEGACY_NUMBER.fullmatch(name.rpartition(b".")[2]):
        # a resolver reads 127.1, 2130706433 or 0x7f.1 as an address: write an address in its usual form
        raise Malformed(f"{host!r} is an address in a legacy form (write it as a.b.c.d)")
    return name.decode()


# -- HTTP ------------------------------------------------------------------------------------------------


class HeadReader:
    """Finds the end of an HTTP request head in a growing buffer, refusing as soon as it sees a line that is not
    ``CRLF``-terminated, a control character, an obs-folded header line or a head longer than :data:`MAX_HEAD`.
    Each byte is looked at once, however the head is cut into reads."""

    def __init__(self) -> None:
        self._line = 0  # where the line being read starts
        self._scanned = 0  # bytes before this were looked at
        self._lines = 0

    def end(self, buffer: bytes | bytearray) -> int:
        """The length of the head at the start of ``buffer`` (through its blank line); raises :class:`Incomplete`
        or :class:`Malformed`."""
        while (newline := buffer.find(b"\n", self._scanned, MAX_HEAD)) >= 0:
            line = bytes(buffer[self._line : newline])
            if not line.endswith(b"\r"):
                raise Malformed("a line ends with a bare LF (HTTP lines end with CRLF)")
            self._check(line[:-1])
            self._line = self._scanned = newline + 1
            self._lines += 1
            if line == b"\r":
                return newline + 1
        limit = min(len(buffer), MAX_HEAD)
        if buffer.find(b"\r", self._scanned, limit - 1) >= 0:
            raise Malformed("a bare CR inside a line")
        self._scanned = max(self._scanned, limit - 1)  # a CR at the very end may yet be followed by its LF
        if len(buffer) >= MAX_HEAD:
            raise Malformed(f"the request head is longer than {MAX_HEAD} bytes")
        raise Incomplete

    def _check(self, line: bytes) -> None:
        if b"\r" in line:
            raise Malformed("a bare CR inside a line")
        if _CONTROL.search(line):
            raise Malformed("a control character in the request head")
        if self._lines == 0 and not line:
            raise Malformed("an empty line before the request line")
        if self._lines > 0 and line[:1] in (b" ", b"\t"):
            raise Malformed("an obs-folded header line (a line starting with whitespace)")


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """A request head as parsed by h11: headers as sent (one ``Host`` at most, one ``Content-Length``)."""

    method: str
    target: str
    version: str
    """``1.0`` or ``1.1``."""
    headers: tuple[tuple[str, str], ...]

    def header(self, name: str) -> str | None:
        """The value of the header ``name`` (lower case), None when there is none."""
        return next((value for key, value in self.headers if key.lower() == name), None)


def http_request(head: bytes) -> HttpRequest:
    """The request whose head (through its blank line, as :class:`HeadReader` found it) is ``head``; raises
    :class:`Malformed`: what h11 refuses (bad request line or header syntax, two ``Host`` headers, none in
    HTTP/1.1, conflicting ``Content-Length``, a ``Transfer-Encoding`` other than ``chunked``), and a body framed
    both by ``Content-Length`` and ``Transfer-Encoding``."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    try:
        conn.receive_data(head)
        event = conn.next_event()
    except h11.RemoteProtocolError as exc:
        raise Malformed(str(exc)[:200]) from None
    if not isinstance(event, h11.Request):
        raise Malformed("not a complete request head")
    if event.http_version not in (b"1.0", b"1.1"):
        raise Malformed(f"HTTP/{event.http_version.decode()} (the proxy speaks HTTP/1.0 and HTTP/1.1)")
    headers = tuple((name.decode("latin-1"), value.decode("latin-1")) for name, value in event.headers.raw_items())
    names = {name.lower() for name, _ in headers}
    if {"content-length", "transfer-encoding"} <= names:
        raise Malformed("the body is framed twice (Content-Length and Transfer-Encoding)")
    return HttpRequest(event.method.decode(), event.target.decode(), event.http_version.decode(), headers)


# -- SOCKS5 ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Socks5Request:
    command: int
    host: str
    """As :func:`target_host` gives it."""
    port: int


def socks5_methods(data: bytes | bytearray) -> tuple[bytes, int]:
    """The authentication methods of a SOCKS5 greeting at the start of ``data`` and its length; raises
    :class:`Incomplete` or :class:`Malformed`."""
    if len(data) < 2:
        raise Incomplete
    if data[0] != 5:
        raise Malformed(f"SOCKS version {data[0]} (only 5 is served)")
    count = data[1]
    if count == 0:
        raise Malformed("a SOCKS5 greeting with no authentication method")
    if len(data) < 2 + count:
        raise Incomplete
    return bytes(data[2 : 2 + count]), 2 + count


def socks5_request(data: bytes | bytearray) -> tuple[Socks5Request, int]:
    """The SOCKS5 request at the start of ``data`` and its length; raises :class:`Incomplete` or
    :class:`Malformed` (a wrong version or reserved byte, an unknown address type, an empty or invalid name,
    port 0)."""
    if len(data) < 5:
        raise Incomplete
    version, command, reserved, kind = data[0], data[1], data[2], data[3]
    if version != 5 or reserved != 0:
        raise Malformed("a SOCKS5 request needs version 5 and a zero reserved byte")
    if kind == 1:
        start, size = 4, 4
    elif kind == 4:
        start, size = 4, 16
    elif kind == 3:
        start, size = 5, data[4]
        if size == 0:
            raise Malformed("an empty SOCKS5 host name")
    else:
        raise Malformed(f"SOCKS5 address type {kind} is unknown")
    end = start + size + 2
    if len(data) < end:
        raise Incomplete
    raw = bytes(data[start : start + size])
    if kind == 1:
        host = str(ipaddress.IPv4Address(raw))
    elif kind == 4:
        host = target_host(str(ipaddress.IPv6Address(raw)))
    else:
        if raw.startswith(b"["):
            raise Malformed("a SOCKS5 host name in brackets (send an address as an address)")
        host = target_host(raw)
    port = int.from_bytes(data[end - 2 : end], "big")
    if port == 0:
        raise Malformed("port 0")
    return Socks5Request(command, host, port), end


# -- TLS -------------------------------------------------------------------------------------------------


class ClientHelloReader:
    """Reassembles the TLS ClientHello at the start of a growing buffer from its handshake records, however they
    are cut, within :data:`MAX_CLIENT_HELLO`; each record is taken once, however the buffer is cut into reads."""

    def __init__(self) -> None:
        self._message = bytearray()
        self._pos = 0  # the end of the records taken
        self._need: int | None = None

    def server_name(self, buffer: bytes | bytearray) -> str | None:
        """The ClientHello's server name (None when it names none); raises :class:`Incomplete` or
        :class:`Malformed`."""
        while self._need is None or len(self._message) < self._need:
            self._take_record(buffer)
        if len(self._message) > self._need:
            raise Malformed("a handshake message after the ClientHello in its record")
        return _server_name(_Reader(bytes(self._message[4:])))

    def _take_record(self, buffer: bytes | bytearray) -> None:
        header = bytes(buffer[self._pos : self._pos + 5])
        if len(header) < 5:
            raise Incomplete
        if header[0] != _HANDSHAKE:
            raise Malformed("a record other than a handshake before the ClientHello is complete")
        if header[1] != 3 or header[2] > 4:
            raise Malformed(f"record version {header[1]}.{header[2]} is not TLS")
        length = int.from_bytes(header[3:5], "big")
        if not 0 < length <= _MAX_RECORD:
            raise Malformed(f"a handshake record of {length} bytes (1 to {_MAX_RECORD})")
        end = self._pos + 5 + length
        if end > _MAX_HELLO_RECORDS_BYTES:
            raise Malformed(f"a ClientHello spread over more than {_MAX_HELLO_RECORDS_BYTES} bytes of records")
        if len(buffer) < end:
            raise Incomplete
        self._message += buffer[self._pos + 5 : end]
        self._pos = end
        if self._need is None and len(self._message) >= 4:
            if self._message[0] != _CLIENT_HELLO:
                raise Malformed(f"handshake message type {self._message[0]} is not a ClientHello")
            self._need = 4 + int.from_bytes(self._message[1:4], "big")
            if self._need > MAX_CLIENT_HELLO:
                raise Malformed(f"a ClientHello of {self._need} bytes (at most {MAX_CLIENT_HELLO})")


def client_hello_sni(data: bytes | bytearray) -> str | None:
    """The server name of the TLS ClientHello at the start of ``data`` (None when it names none); raises
    :class:`Incomplete` or :class:`Malformed`."""
    return ClientHelloReader().server_name(data)


class _Reader:
    """Reads a complete message: running out of bytes is a malformed message, not an incomplete one."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise Malformed("a length runs past the end of its ClientHello field")
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def number(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def vector(self, size: int) -> bytes:
        return self.take(self.number(size))

    def done(self) -> bool:
        return self.pos == len(self.data)


def _server_name(hello: _Reader) -> str | None:
    if hello.take(2)[0] != 3:
        raise Malformed("a ClientHello whose version is not TLS")
    hello.take(32)  # random
    if len(hello.vector(1)) > 32:
        raise Malformed("a session id longer than 32 bytes")
    suites = hello.vector(2)
    if not suites or len(suites) % 2:
        raise Malformed("a ClientHello without cipher suites")
    if not hello.vector(1):
        raise Malformed("a ClientHello without compression methods")
    if hello.done():
        return None  # no extensions (TLS 1.2 allows it): no server name
    extensions = _Reader(hello.vector(2))
    if not hello.done():
        raise Malformed("bytes after the ClientHello's extensions")
    seen: set[int] = set()
    name = None
    while not extensions.done():
        kind = extensions.number(2)
        body = extensions.vector(2)
        if kind in seen:
            raise Malformed(f"extension {kind} twice")
        seen.add(kind)
        if kind == _SERVER_NAME:
            name = _host_name(_Reader(body))
    return name


def _host_name(extension: _Reader) -> str:
    names = _Reader(extension.vector(2))
    if not extension.done():
        raise Malformed("bytes after the server name list")
    found = None
    while not names.done():
        if names.number(1) != _HOST_NAME:
            raise Malformed("a server name that is not a host name")
        value = names.vector(2)
        if found is not None:
            raise Malformed("two host names in the server name extension")
        found = value
    if found is None:
        raise Malformed("an empty server name extension")
    try:
        return target_host(found)
    except Malformed as exc:
        raise Malformed(f"the server name: {exc}") from None
