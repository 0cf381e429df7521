"""The front door's client for the nodes' control planes: HTTP/1.1 on kept-alive connections, parsed by h11.

A control-plane call is small (a create, a kill, a list) and the front door makes one for nearly every request it
takes, so its client's cost is the front door's: httpx spends about 0.5 ms of CPU a request here over what h11 on
an asyncio stream does (measured against the same loopback server), a third of what a front door adds to a create.
Its failures are httpx's transport errors, so the front door treats both of its clients' failures alike (the
proxied data plane stays on httpx, whose streaming it needs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import h11
import httpx

__all__ = ["NodeAnswer", "NodeClient"]

#: Idle connections kept per node server; more than that at once are closed after their call.
_IDLE_PER_NODE = 64
_READ = 65536


@dataclass(frozen=True, slots=True)
class NodeAnswer:
    """A node server's whole answer (the attributes the front door reads of an ``httpx.Response``)."""

    status_code: int
    headers: httpx.Headers
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.state = h11.Connection(h11.CLIENT)

    def usable(self) -> bool:
        return self.state.our_state is h11.IDLE and not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


class NodeClient:
    """Calls of node servers, each on an idle connection to its server or a new one."""

    def __init__(self, connect_timeout: float, answer_timeout: float) -> None:
        self._connect_timeout = connect_timeout
        self._answer_timeout = answer_timeout
        self._idle: dict[tuple[str, int], list[_Connection]] = {}

    async def request(self, method: str, url: str, *, headers: Iterable[tuple[str, str]], content: bytes) -> NodeAnswer:
        """``method url`` with ``content``; a call that fails raises :class:`httpx.TransportError` (a
        :class:`httpx.ConnectError` where no connection could be made: the node's server is not there)."""
        parts = urlsplit(url)
        where = (parts.hostname or "", parts.port or 80)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        head = [("host", parts.netloc), ("content-length", str(len(content))), *headers]
        message = h11.Request(method=method, target=target, headers=head)
        while (connection := self._take(where)) is not None:
            try:  # a kept connection the server closed meanwhile: it read nothing of this call, so try the next
                return await self._exchange(where, connection, message, content)
            except _Stale:
                continue
        connection = await self._open(where)
        try:
            return await self._exchange(where, connection, message, content)
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
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(*where), self._connect_timeout)
        except (OSError, TimeoutError) as exc:
            raise httpx.ConnectError(f"cannot connect to {where[0]}:{where[1]}: {exc!r}") from None
        return _Connection(reader, writer)

    async def _exchange(
        self, where: tuple[str, int], connection: _Connection, message: h11.Request, content: bytes
    ) -> NodeAnswer:
        try:
            async with asyncio.timeout(self._answer_timeout):
                answer = await self._call(connection, message, content)
        except TimeoutError:
            connection.close()
            raise httpx.ReadTimeout(f"{where[0]}:{where[1]} did not answer within {self._answer_timeout:g} s") from None
        except (OSError, h11.ProtocolError) as exc:
            connection.close()
            raise httpx.ReadError(f"{where[0]}:{where[1]}: {exc!r}") from None
        except BaseException:  # cancelled mid-call: the connection's state is unknown
            connection.close()
            raise
        if connection.state.our_state is h11.DONE and connection.state.their_state is h11.DONE:
            connection.state.start_next_cycle()
            idle = self._idle.setdefault(where, [])
            if len(idle) < _IDLE_PER_NODE:
                idle.append(connection)
                return answer
        connection.close()
        return answer

    async def _call(self, connection: _Connection, message: h11.Request, content: bytes) -> NodeAnswer:
        state = connection.state
        try:
            call = state.send(message) + state.send(h11.Data(data=content)) + state.send(h11.EndOfMessage())
            connection.writer.write(call)
            await connection.writer.drain()
        except ConnectionError:  # reset or closed by the server before it read the call
            connection.close()
            raise _Stale from None
        response: h11.Response | None = None
        body = bytearray()
        while True:
            event = state.next_event()
            if event is h11.NEED_DATA:
                data = await connection.reader.read(_READ)
                if not data and response is None:
                    connection.close()
                    raise _Stale
                state.receive_data(data)
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert response is not None
                headers = httpx.Headers([(k.decode(), v.decode("latin-1")) for k, v in response.headers])
                return NodeAnswer(response.status_code, headers, bytes(body))
            elif isinstance(event, h11.ConnectionClosed):
                raise h11.RemoteProtocolError("the connection closed mid-answer")

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                with contextlib.suppress(OSError):
                    connection.close()
        self._idle.clear()


class _Stale(Exception):
    """A kept connection the server had closed: nothing of the call was answered."""
