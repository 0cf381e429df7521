"""The listening socket serve and mcp bind before anything starts."""

from __future__ import annotations

import asyncio
import socket

from execspace.listening import listen


async def test_connections_accepted_on_it_send_small_answers_at_once() -> None:
    """asyncio turns Nagle off only for sockets that say they are TCP: without it each small answer of serve waited
    for the client's delayed ACK (a 40 ms floor under every SDK call)."""
    accepted: list[int] = []

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        accepted.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    with listen("127.0.0.1", 0, "test") as sock:
        server = await asyncio.start_server(on_client, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
            while not accepted:
                await asyncio.sleep(0.01)
            writer.close()
    assert accepted == [1]
