"""Request bodies read with a bound: a JSON object a route takes is read as it arrives and refused once it passes
its route's limit (a ``Content-Length`` above it is refused before anything is read), so that no request makes the
server hold more than that."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

__all__ = ["CONTROL_BODY_BYTES", "DATA_BODY_BYTES", "BadBody", "BodyTooLarge", "json_object"]

#: Largest body of a control-plane request (a create's metadata and envVars are its biggest parts).
CONTROL_BODY_BYTES = 1024 * 1024
#: Largest JSON body of a data-plane request (a cell's code), as envd's Connect services take at most.
DATA_BODY_BYTES = 16 * 1024 * 1024


class BadBody(Exception):
    """A body the route cannot take (answered 400)."""


class BodyTooLarge(BadBody):
    """A body longer than the route takes (answered 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is larger than this route takes ({limit} bytes)")
        self.limit = limit


async def json_object(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object (``{}`` when empty).

    Raises:
        BodyTooLarge: it is longer than ``limit`` bytes.
        BadBody: it is not JSON, or not an object.
    """
    raw = await _bounded(request, limit)
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadBody(f"the request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadBody("the request body must be a JSON object")
    return body


async def _bounded(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)
