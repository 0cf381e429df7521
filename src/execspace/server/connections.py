"""The server's connections, bounded: how many it holds at once, and how long one may take to send a request head.

uvicorn caps neither: it takes every connection its listening socket accepts, and times a connection out only once
it has answered a request on it (keep-alive), so a client that opens connections and never completes a request head
(slowloris) holds a descriptor each until the server has none left. :class:`ConnectionGuard` wraps uvicorn's HTTP
protocol (``uvicorn.Config(http=...)`` takes a protocol class; the wrapper composes it, never subclasses it) and
its ASGI application:

- past ``limit`` open connections a new one is closed at once (a reset: the client retries elsewhere or later),
  so connections never take the descriptors the sandboxes' programs and files need;
- a connection must complete a request head within ``head_timeout`` seconds of being opened, or of the first byte
  of its next head; an idle one is closed ``idle_timeout`` seconds after its previous response.

A head is complete when uvicorn calls the application for it; the application call is matched to its connection by
the peer address both see. The application also finds in its scope's extensions, under :data:`ABORT`, a callable that
drops the request's connection at once (:func:`abort_connection`): what a sandbox's streams do when the sandbox ends
under them, as a microVM's connections do when it dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import struct
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["ABORT", "ConnectionDropped", "ConnectionGuard", "abort_connection", "raise_descriptor_limit"]

_log = logging.getLogger("execspace.server")

Peer = tuple[str, int]

#: The scope extension holding a callable that drops the request's connection (no answer, no end of its body).
ABORT = "execspace.abort"


class ConnectionDropped(Exception):
    """Raised in a request whose server gives no way to drop its connection, so that the server drops it."""


async def abort_connection(scope: Scope, *, reset: bool = False) -> None:
    """Drop the connection of the request of ``scope`` now, mid-answer: its client reads a connection that ended
    before the answer did (``reset``: a TCP RST, "connection reset by peer", rather than the FIN of a peer that
    closed). Where the server is not guarded (hypercorn, behind TLS), raise :class:`ConnectionDropped` instead,
    which that server answers by closing the connection (or resetting the HTTP/2 stream) itself."""
    abort = scope.get("extensions", {}).get(ABORT)
    if abort is None:
        raise ConnectionDropped("the sandbox ended during the request")
    abort(reset)
    await asyncio.sleep(0)  # the transport reports the connection lost: uvicorn then sends nothing more


def raise_descriptor_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit (what an unprivileged process may); the limit
    it has now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return soft


class ConnectionGuard:
    """Counts and times the connections of one server (see the module's docstring)."""

    def __init__(self, app: ASGIApp, *, limit: int, head_timeout: float, idle_timeout: float) -> None:
        self.limit = limit
        self.head_timeout = head_timeout
        self.idle_timeout = idle_timeout
        self.refused = 0
        """Connections closed because ``limit`` were open."""
        self.timed_out = 0
        """Connections closed because no request head came in time."""
        self._app = app
        self._open: dict[Peer, _Guarded] = {}

    @property
    def open(self) -> int:
        return len(self._open)

    def protocol(self, inner: Callable[..., asyncio.Protocol]) -> type[asyncio.Protocol]:
        """What ``uvicorn.Config(http=...)`` takes (a protocol class, built with keywords): ``inner``, uvicorn's
        protocol class, guarded by this guard."""
        guard = self

        class Guarded(_Guarded):
            def __init__(self, **kwargs: Any) -> None:
                super().__init__(guard, inner(**kwargs))

        return Guarded

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        conn = self._open.get((client[0], client[1])) if scope["type"] == "http" and client else None
        if conn is None:
            await self._app(scope, receive, send)
            return
        scope = {**scope, "extensions": {**(scope.get("extensions") or {}), ABORT: conn.abort}}
        conn.busy += 1
        conn.stop_timer()
        try:
            await self._app(scope, receive, send)
        finally:
            conn.busy -= 1
            if not conn.busy:
                conn.start_timer(self.idle_timeout, head=False)

    def _admit(self, conn: _Guarded, peer: Peer | None) -> bool:
        if peer is None or len(self._open) >= self.limit:
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                _log.warning("refused %d connections: %d were open, the most it holds", self.refused, self.limit)
            return False
        self._open[peer] = conn
        return True

    def _forget(self, peer: Peer | None) -> None:
        if peer is not None:
            self._open.pop(peer, None)


class _Guarded(asyncio.Protocol):
    """One connection: uvicorn's protocol, admitted or not, and its head timer."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self._peer: Peer | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._head_due = False
        """The timer running is a head's (bytes of a head came): more bytes do not restart it."""
        self.busy = 0
        """Requests of this connection the application is answering."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self._peer = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) and len(peer) >= 2 else None
        if not self._guard._admit(self, self._peer):
            self._peer = None
            transport.abort()
            return
        self._inner.connection_made(transport)
        self.start_timer(self._guard.head_timeout, head=True)

    def start_timer(self, seconds: float, *, head: bool) -> None:
        self.stop_timer()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expire)
        self._head_due = head

    def stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._head_due = False

    def abort(self, reset: bool) -> None:
        """Close the connection at once, unsent data dropped; ``reset``: with a TCP RST instead of a FIN."""
        if self._transport is None:
            return
        sock = self._transport.get_extra_info("socket")
        if reset and sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._transport.abort()

    def _expire(self) -> None:
        self._timer = None
        if self._transport is not None and not self.busy:
            self._guard.timed_out += 1
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_timer()
        if self._peer is None:
            return  # refused: uvicorn never saw it
        self._guard._forget(self._peer)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self.busy and not self._head_due and self._peer is not None:
            self.start_timer(self._guard.head_timeout, head=True)  # a new head begins: it has its own bound
        assert isinstance(self._inner, asyncio.Protocol)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        assert isinstance(self._inner, asyncio.Protocol)
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()
