"""The front door's control-plane client (``server/cluster/nodeclient.py``) against real loopback servers: it keeps
connections, survives a kept one the server closed, and fails as httpx's transport errors the front door handles."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

httpx = pytest.importorskip("httpx", reason="needs the serve extra (pip install 'execspace[serve]')")
pytest.importorskip("h11", reason="needs the serve extra (pip install 'execspace[serve]')")

from execspace.server.cluster.nodeclient import NodeClient  # noqa: E402

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")),
        0,
    )
    return head + await reader.readexactly(length)


def _answer(body: dict[str, object], *, close: bool = False) -> bytes:
    data = json.dumps(body).encode()
    extra = b"connection: close\r\n" if close else b""
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        len(data),
        extra,
        data,
    )


@contextlib.asynccontextmanager
async def _server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A loopback server; yields its URL and the list of connections it took (one entry each)."""
    connections: list[int] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}", connections


async def _echo_path(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while (request := await _read_request(reader)) is not None:
        method, target = request.split(b" ")[:2]
        body = request.split(b"\r\n\r\n", 1)[1]
        writer.write(_answer({"method": method.decode(), "target": target.decode(), "body": body.decode()}))
        await writer.drain()


async def test_calls_share_one_kept_connection_and_carry_their_bodies() -> None:
    client = NodeClient(5, 5)
    async with _server(_echo_path) as (url, connections):
        try:
            for i in range(20):
                answer = await client.request("POST", f"{url}/sandboxes?n={i}", headers=[], content=b"x" * i)
                assert answer.status_code == 200
                assert answer.json() == {"method": "POST", "target": f"/sandboxes?n={i}", "body": "x" * i}
            assert len(connections) == 1
        finally:
            await client.aclose()


async def test_a_kept_connection_the_server_closed_is_replaced_without_an_error() -> None:
    async def one_answer_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if await _read_request(reader) is not None:
            writer.write(_answer({"ok": True}))  # kept alive by its headers, then closed: as an idle timeout does
            await writer.drain()

    client = NodeClient(5, 5)
    async with _server(one_answer_then_close) as (url, connections):
        try:
            for _ in range(10):
                assert (await client.request("GET", f"{url}/health", headers=[], content=b"")).json() == {"ok": True}
            assert len(connections) == 10
        finally:
            await client.aclose()


async def test_an_answer_that_says_close_is_not_kept() -> None:
    async def closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if await _read_request(reader) is not None:
            writer.write(_answer({"ok": True}, close=True))
            await writer.drain()

    client = NodeClient(5, 5)
    async with _server(closing) as (url, connections):
        try:
            for _ in range(3):
                assert (await client.request("GET", f"{url}/x", headers=[], content=b"")).status_code == 200
            assert len(connections) == 3
        finally:
            await client.aclose()


async def test_nothing_listening_is_a_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(httpx.ConnectError):
            await NodeClient(5, 5).request("GET", f"http://127.0.0.1:{port}/", headers=[], content=b"")


async def test_a_server_that_never_answers_is_a_timeout_and_one_that_breaks_off_a_read_error() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client gives up

    async def half(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
        await writer.drain()

    async with _server(silent) as (url, _):
        with pytest.raises(httpx.ReadTimeout):
            await NodeClient(5, 0.3).request("GET", f"{url}/", headers=[], content=b"")
    async with _server(half) as (url, _):
        with pytest.raises(httpx.TransportError):
            await NodeClient(5, 5).request("GET", f"{url}/", headers=[], content=b"")


async def test_a_target_or_header_that_would_end_its_line_is_refused_before_anything_is_sent() -> None:
    client = NodeClient(5, 5)
    async with _server(_echo_path) as (url, connections):
        try:
            for target, headers in (("/a\r\nx-injected: 1", []), ("/a b", []), ("/a", [("x-api-key", "k\r\nx: 1")])):
                with pytest.raises(httpx.LocalProtocolError):
                    await client.request("GET", url + target, headers=headers, content=b"")
            assert connections == []
            answer = await client.request("GET", f"{url}/%0d%0a", headers=[], content=b"")  # encoded: sent as is
            assert answer.json()["target"] == "/%0d%0a"
        finally:
            await client.aclose()


async def test_dropping_a_server_fails_its_calls_in_flight_at_once_as_connect_errors() -> None:
    received = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        received.set()
        await reader.read()  # never answers: a machine that vanished closes nothing

    client = NodeClient(5, 300)
    async with _server(silent) as (url, _):
        call = asyncio.ensure_future(client.request("GET", f"{url}/x", headers=[], content=b""))
        await received.wait()
        client.drop(url)
        with pytest.raises(httpx.ConnectError):
            await asyncio.wait_for(call, 5)
