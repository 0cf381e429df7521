"""A bare HTTP/1.1 loop that answers the E2B SDK's ``Sandbox.create`` and ``commands.run`` with canned bytes: the
same Connect stream ``execspace serve`` sends for a command that exits 0 (start event, end event, end of stream),
written at once, with no process behind it. Timing the official SDK against it shows the SDK's own client cost.

    python bench/bare_envd.py    # prints the port it listens on, then serves until killed
"""

from __future__ import annotations

import asyncio
import json
import struct

_SANDBOX = {"templateID": "base", "sandboxID": "bare", "clientID": "bare", "envdVersion": "0.5.7"}


def _envelope(flags: int, message: dict[str, object]) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return bytes([flags]) + struct.pack(">I", len(data)) + data


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


_CREATED = json.dumps(_SANDBOX).encode()
_CREATE_ANSWER = b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(_CREATED),
    _CREATED,
)
_END = {"exitCode": 0, "exited": True, "status": "exit status 0"}
_START_ANSWER = b"".join(
    [
        b"HTTP/1.1 200 OK\r\ncontent-type: application/connect+json\r\nconnect-content-encoding: identity\r\n"
        b"transfer-encoding: chunked\r\n\r\n",
        _chunk(_envelope(0, {"event": {"start": {"pid": 1}}})),
        _chunk(_envelope(0, {"event": {"end": _END}})),
        _chunk(_envelope(2, {})),
        b"0\r\n\r\n",
    ]
)
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> None:
    if headers.get("transfer-encoding") == "chunked":  # the SDK streams RPC requests
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            await reader.readexactly(size + 2)
        await reader.readexactly(2)
    elif "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            path = head[0].split()[1]
            headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
            await _body(reader, headers)
            if path.startswith("/v2/sandboxes"):
                writer.write(_CREATE_ANSWER)
            elif path == "/process.Process/Start":
                writer.write(_START_ANSWER)
            else:
                writer.write(_NOT_FOUND)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def main() -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
