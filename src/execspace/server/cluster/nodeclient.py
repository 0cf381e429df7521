"""The front door's client for the nodes' control planes: HTTP/1.1 on kept-alive connections, answers parsed by
httptools (the C parser uvicorn serves with).

A control-plane call is small (a create, a kill, a list) and the front door makes one for nearly every request it
takes, so its client's cost is the front door's: a pure-Python client (httpx, or h11 on asyncio streams) spends
most of a front door's CPU of a create. This one writes the request as one buffer and parses the answer in C as it
arrives, in an asyncio protocol (no stream reader between). Its failures are httpx's transport errors, so the front
door treats both of its clients' failures alike (the proxied data plane stays on httpx, whose streaming it needs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
import httpx

__all__ = ["NodeAnswer", "NodeClient"]

#: Idle connections kept per node server; more than that at once are closed after their call.
_IDLE_PER_NODE = 64
#: What may not be sent in a request line or a header value: it would end it (request smuggling).
_UNSENDABLE = frozenset("\r\n\0")


@dataclass(frozen=True, slots=True)
class NodeAnswer:
    """A node server's whole answer: its status, headers (names in lower case) and body."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)


class _Connection(asyncio.Protocol):
    """One kept-alive connection: one call at a time, its answer parsed as it arrives."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser = httptools.HttpResponseParser(self)
        self._answer: asyncio.Future[NodeAnswer] | None = None
        self._received = False
        self._headers: dict[str, str] = {}
        self._body = bytearray()
        self.keep = False

    # --- asyncio.Protocol --------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio's classes: no isinstance

    def data_received(self, data: bytes) -> None:
        self._received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"the node's server answered what is not HTTP: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._received:
            self._fail(httpx.ReadError(f"the connection closed mid-answer ({exc!r})"))
        else:
            self._fail(_Stale())

    # --- httptools callbacks -----------------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        self.keep = self._parser.should_keep_alive()
        if self._answer is not None and not self._answer.done():
            self._answer.set_result(NodeAnswer(self._parser.get_status_code(), self._headers, bytes(self._body)))

    # --- calls ---------------------------------------------------------------------------------------------------

    def usable(self) -> bool:
        return self.keep and not self.closed and self.transport is not None and not self.transport.is_closing()

    def call(self, request: bytes) -> asyncio.Future[NodeAnswer]:
        assert self.transport is not None
        self._answer = asyncio.get_running_loop().create_future()
        self._received, self._headers, self._body, self.keep = False, {}, bytearray(), False
        self.transport.write(request)
        return self._answer

    def abort(self, error: Exception) -> None:
        """End the connection, its call failing with ``error``."""
        self._fail(error)

    def _fail(self, error: Exception) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(error)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class NodeClient:
    """Calls of node servers, each on an idle connection to its server or a new one."""

    def __init__(self, connect_timeout: float, answer_timeout: float) -> None:
        self._connect_timeout = connect_timeout
        self._answer_timeout = answer_timeout
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._busy: dict[tuple[str, int], set[_Connection]] = {}

    async def request(self, method: str, url: str, *, headers: Iterable[tuple[str, str]], content: bytes) -> NodeAnswer:
        """``method url`` with ``content``; a call that fails raises :class:`httpx.TransportError` (a
        :class:`httpx.ConnectError` where no connection could be made: the node's server is not there)."""
        parts = urlsplit(url)
        where = (parts.hostname or "", parts.port or 80)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        request = _request(method, target, [("host", parts.netloc), *headers], content)
        while (connection := self._take(where)) is not None:
            try:  # a kept connection the server closed meanwhile: it read nothing of this call, so try the next
                return await self._exchange(where, connection, request)
            except _Stale:
                continue
        connection = await self._open(where)
        try:
            return await self._exchange(where, connection, request)
        except _Stale as exc:
            raise httpx.RemoteProtocolError(f"{url}: the server closed the connection without an answer") from exc

    def _take(self, where: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(where, [])
        while idle:
            connection = idle.pop()
            if connection.usable():
                return connection
            connection.close()
        return None

    async def _open(self, where: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(loop.create_connection(_Connection, *where), self._connect_timeout)
        except (OSError, TimeoutError) as exc:
            raise httpx.ConnectError(f"cannot connect to {where[0]}:{where[1]}: {exc!r}") from None
        return connection

    async def _exchange(self, where: tuple[str, int], connection: _Connection, request: bytes) -> NodeAnswer:
        busy = self._busy.setdefault(where, set())
        busy.add(connection)
        try:
            async with asyncio.timeout(self._answer_timeout):
                answer = await connection.call(request)
        except TimeoutError:
            connection.close()
            raise httpx.ReadTimeout(f"{where[0]}:{where[1]} did not answer within {self._answer_timeout:g} s") from None
        except BaseException:  # failed or cancelled mid-call: the connection's state is unknown
            connection.close()
            raise
        finally:
            busy.discard(connection)
        if connection.usable():
            idle = self._idle.setdefault(where, [])
            if len(idle) < _IDLE_PER_NODE:
                idle.append(connection)
                return answer
        connection.close()
        return answer

    def drop(self, url: str) -> None:
        """The server at ``url`` is gone: its calls in flight fail now (:class:`httpx.ConnectError`), however its
        connections look (a machine that vanished closes none of them)."""
        parts = urlsplit(url)
        where = (parts.hostname or "", parts.port or 80)
        for connection in [*self._idle.pop(where, []), *self._busy.pop(where, set())]:
            connection.abort(httpx.ConnectError(f"{url} is gone"))

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                with contextlib.suppress(OSError):
                    connection.close()
        self._idle.clear()


def _request(method: str, target: str, headers: list[tuple[str, str]], content: bytes) -> bytes:
    """The request as one buffer; a target or header that would end its line early is refused."""
    lines = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in headers), f"content-length: {len(content)}"]
    if any(not _UNSENDABLE.isdisjoint(line) for line in lines) or " " in target:
        raise httpx.LocalProtocolError(f"{method} {target!r}: a request line or header holds a line break or space")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + content


class _Stale(Exception):
    """A kept connection the server had closed: nothing of the call was answered."""
