"""One log line per request (``execspace serve -v``): method, path, the sandbox it concerns, status and duration,
written when the answer ends (a stream's line when the stream does).

The path is the client's: it is logged without its query (a signed file URL's signature stays out of the log),
cut to :data:`PATH_CHARS` and with control characters escaped, so that a request cannot forge or hide lines."""

from __future__ import annotations

import json
import logging
import re
import time

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .routing import target_of

__all__ = ["LOGGER", "PATH_CHARS", "RequestLog"]

#: The logger of the lines (INFO).
LOGGER = "execspace.server.requests"
#: Characters of a path logged; the rest is cut (marked with ``...``).
PATH_CHARS = 200

_log = logging.getLogger(LOGGER)
#: A control-plane path naming a sandbox (``/sandboxes/{id}``, ``/v2/sandboxes/{id}/connect``...).
_CONTROL_SANDBOX = re.compile(r"/(?:v2/)?sandboxes/([^/]+)")
_CREATES = frozenset({"/sandboxes", "/v2/sandboxes"})
#: Bytes of a create's answer read for the new sandbox's id.
_CREATE_ANSWER = 64 * 1024
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}


class RequestLog:
    """Wraps the server's application; every request is passed through unchanged."""

    def __init__(self, app: ASGIApp, domain: str | None) -> None:
        self._app = app
        self._domain = domain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        request = _Request(scope, self._sandbox_of(scope))

        async def sent(message: Message) -> None:
            request.saw(message)
            await send(message)

        try:
            await self._app(scope, receive, sent)
        finally:
            _log.info("%s", request.line())

    def _sandbox_of(self, scope: Scope) -> str | None:
        target = target_of(Headers(scope=scope), self._domain)
        if target is not None:
            return target.sandbox_id
        found = _CONTROL_SANDBOX.match(scope["path"])
        return found[1] if found is not None and found[1] != "metrics" else None


class _Request:
    def __init__(self, scope: Scope, sandbox: str | None) -> None:
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.sandbox = sandbox
        self.status: int | None = None
        self._create = self.method == "POST" and self.path in _CREATES
        self._answer = b""
        self._started = time.monotonic()

    def saw(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
        elif message["type"] == "http.response.body" and self._create and len(self._answer) < _CREATE_ANSWER:
            self._answer += bytes(message.get("body", b""))[: _CREATE_ANSWER - len(self._answer)]

    def line(self) -> str:
        sandbox = self.sandbox or self._created() or "-"
        status = str(self.status) if self.status is not None else "dropped"
        elapsed = (time.monotonic() - self._started) * 1000
        return (
            f"{_printable(self.method)} {_printable(self.path)} sandbox={_printable(sandbox)} {status} {elapsed:.1f}ms"
        )

    def _created(self) -> str | None:
        """The new sandbox's id, from a create's answer."""
        if not self._answer or self.status != 201:
            return None
        try:
            found = json.loads(self._answer).get("sandboxID")
        except (ValueError, AttributeError):
            return None
        return found if isinstance(found, str) else None


def _printable(text: str) -> str:
    cut = text if len(text) <= PATH_CHARS else text[:PATH_CHARS] + "..."
    return cut.translate(_CONTROLS)
