"""Streaming a request to a node's server and its answer back, neither body ever held whole.

The request's body goes up as the client sends it (an async generator over the ASGI ``receive``), the answer's
comes down as the node sends it (``aiter_raw``: bytes as they came, their encoding untouched). A client that leaves
ends the upstream request at once; an upstream connection that breaks drops the client's, so the SDK sees what it
sees when a sandbox's host goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
from starlette.types import Receive, Scope, Send

from ..connections import abort_connection

__all__ = ["ClientGone", "proxy"]

#: Headers of one hop, not passed on (``host`` is the node's; the body's framing is httpx's to set again).
_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te", b"trailer", b"upgrade", b"host"}
)


class ClientGone(Exception):
    """The client left while its body was being sent on."""


async def proxy(
    client: httpx.AsyncClient,
    base_url: str,
    scope: Scope,
    receive: Receive,
    send: Send,
    extra: list[tuple[bytes, bytes]],
    cut: asyncio.Event,
) -> None:
    """Send the request of ``scope`` to ``base_url`` (its path and query kept) and stream the answer back.

    ``extra``: headers of the front door's own, in place of the client's of the same names (lower case).

    Raises ``httpx.ConnectError`` or ``httpx.ConnectTimeout`` when the node cannot be reached (nothing was sent to
    the client yet: the caller answers); once the answer has begun, a broken upstream, or ``cut`` (the node is
    gone), drops the client's connection."""
    dropped = _HOP.union(k for k, _ in extra) if extra else _HOP
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in dropped] + extra
    names = {k.lower() for k, _ in scope["headers"]}
    body_done = asyncio.Event()
    has_body = b"content-length" in names or b"transfer-encoding" in names

    async def body() -> AsyncIterator[bytes]:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            if chunk := message.get("body", b""):
                yield chunk
            if not message.get("more_body", False):
                body_done.set()
                return

    if not has_body:
        body_done.set()
    url = base_url + scope.get("raw_path", scope["path"].encode()).decode("latin-1")
    if scope.get("query_string"):
        url += "?" + scope["query_string"].decode("latin-1")
    request = client.build_request(scope["method"], url, headers=headers, content=body() if has_body else None)
    response = await client.send(request, stream=True)
    relay = asyncio.ensure_future(_relay(response, scope, send))
    left = asyncio.ensure_future(_until_gone(receive, body_done))
    ended = asyncio.ensure_future(cut.wait())
    try:
        await asyncio.wait({relay, left, ended}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (left, ended, relay):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await relay
        with contextlib.suppress(Exception):
            await response.aclose()
    if relay.done() and not relay.cancelled() and relay.exception() is not None:
        raise relay.exception()  # type: ignore[misc]
    if cut.is_set() and not left.done():  # the node went while answering: so does this connection
        await abort_connection(scope, reset=True)


async def _relay(response: httpx.Response, scope: Scope, send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP],
        }
    )
    try:
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except httpx.HTTPError:  # the node went away mid-answer: so does this connection
        await abort_connection(scope, reset=True)
        return
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _until_gone(receive: Receive, body_done: asyncio.Event) -> None:
    """Return once the client has left (read only after its body is whole: the body is the proxy's to read)."""
    await body_done.wait()
    while (await receive())["type"] != "http.disconnect":
        pass
