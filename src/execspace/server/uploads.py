"""Upload bodies of ``POST /files``, read as they arrive: gzip decoded a bounded piece at a time, multipart parsed
incrementally (python-multipart's streaming parser), so that no body is ever held whole, however large it is or
claims to be.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Literal

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request

from ..errors import UsageError

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

__all__ = ["MultipartBody", "Part", "decoded_body", "drain_body"]

#: Decoded bytes one step of gzip inflation yields: a small body cannot become a large piece of memory.
_PIECE = 256 * 1024
#: Bytes of header lines one part may carry.
_MAX_PART_HEADERS = 16 * 1024

_Event = tuple[Literal["headers", "data", "part_end", "end"], bytes]


async def decoded_body(request: Request) -> AsyncIterator[bytes]:
    """The request's body as it arrives; with ``Content-Encoding: gzip`` decoded at most 256 KiB at a time.
    ``UsageError`` for another encoding, or a gzip stream cut short or followed by more bytes."""
    encoding = request.headers.get("content-encoding", "").strip().lower()
    request.state.body_started = True
    if encoding in ("", "identity"):
        async for chunk in request.stream():
            if chunk:
                yield chunk
        request.state.body_ended = True
        return
    if encoding != "gzip":
        raise UsageError(f"Content-Encoding {encoding!r} is not supported: send the body as it is, or gzip it")
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    async for chunk in request.stream():
        if inflate.eof and chunk:
            raise UsageError("the body goes on after its gzip stream ended: send one gzip stream")
        data = chunk
        while not inflate.eof:
            piece = inflate.decompress(data, _PIECE)
            if piece:
                yield piece
            data = inflate.unconsumed_tail
            # a full piece may leave output pending in zlib with no input left: then ask again, with none
            if not data and len(piece) < _PIECE:
                break
    request.state.body_ended = True
    if not inflate.eof:
        raise UsageError("the gzip body ended before its end of stream")
    if inflate.unused_data:
        raise UsageError("the body goes on after its gzip stream ended: send one gzip stream")


#: What is read of a refused upload's body before its connection is closed (see :func:`drain_body`).
_DRAIN_BYTES = 64 * 1024 * 1024
_DRAIN_SECONDS = 2.0


async def drain_body(request: Request, *, unstarted: bool = False) -> None:
    """Read and drop what is left of a body whose upload was refused part-way (the disk filled), at most
    :data:`_DRAIN_BYTES` for :data:`_DRAIN_SECONDS`: the answer goes with ``Connection: close``, and closing a socket
    with unread bytes resets the connection, which can destroy the answer before the client reads it (a lingering
    close). A body read to its end is left alone, and one never started (refused by its headers) too unless
    ``unstarted``: a refusal the client could not foresee (its user, the sandbox's share) while it sends the body."""
    state = request.state
    if (not unstarted and not getattr(state, "body_started", False)) or getattr(state, "body_ended", False):
        return
    left = _DRAIN_BYTES
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(_DRAIN_SECONDS):
            while left > 0:
                message = await request.receive()
                if message["type"] != "http.request":
                    return
                left -= len(message.get("body", b""))
                if not message.get("more_body", False):
                    return


class Part:
    """One part of a multipart body: its form field's name and file name, from its ``Content-Disposition``."""

    def __init__(self, disposition: bytes) -> None:
        _, options = parse_options_header(disposition)
        self.name = options.get(b"name", b"").decode("utf-8", "replace")
        filename = options.get(b"filename")
        self.filename = filename.decode("utf-8", "replace") if filename is not None else None


class MultipartBody:
    """The parts of a ``multipart/form-data`` body, parsed as it is read: :meth:`next_part` reads up to the next
    part's data, :meth:`data` yields that data as it comes. What one step holds is one chunk of the body."""

    def __init__(self, body: AsyncIterator[bytes], content_type: str) -> None:
        _, params = parse_options_header(content_type)
        boundary = params.get(b"boundary")
        if not boundary:
            raise UsageError("a multipart/form-data upload needs a boundary in its Content-Type")
        self._body = body
        self._events: deque[_Event] = deque()
        self._field, self._value, self._disposition = bytearray(), bytearray(), b""
        callbacks: MultipartCallbacks = {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda data, start, end: self._header_bytes(self._field, data[start:end]),
            "on_header_value": lambda data, start, end: self._header_bytes(self._value, data[start:end]),
            "on_header_end": self._header_end,
            "on_headers_finished": lambda: self._events.append(("headers", self._disposition)),
            "on_part_data": lambda data, start, end: self._events.append(("data", data[start:end])),
            "on_part_end": lambda: self._events.append(("part_end", b"")),
            "on_end": lambda: self._events.append(("end", b"")),
        }
        self._parser = MultipartParser(boundary, callbacks)

    def _part_begin(self) -> None:
        self._field.clear()
        self._value.clear()
        self._disposition = b""

    def _header_bytes(self, into: bytearray, data: bytes) -> None:
        if len(self._field) + len(self._value) + len(data) > _MAX_PART_HEADERS:
            raise UsageError(f"a multipart part's header is longer than {_MAX_PART_HEADERS} bytes")
        into.extend(data)

    def _header_end(self) -> None:
        if bytes(self._field).strip().lower() == b"content-disposition":
            self._disposition = bytes(self._value).strip()
        self._field.clear()
        self._value.clear()

    async def next_part(self) -> Part | None:
        """The next part, its data still unread (what was left of the previous one is skipped); None at the body's
        closing boundary."""
        while True:
            kind, value = await self._next()
            if kind == "headers":
                return Part(value)
            if kind == "end":
                return None

    async def data(self) -> AsyncIterator[bytes]:
        """The current part's data as it is read, to the part's end."""
        while True:
            kind, value = await self._next()
            if kind == "data":
                yield value
            elif kind == "part_end":
                return

    async def _next(self) -> _Event:
        while not self._events:
            chunk = await anext(self._body, None)
            if chunk is None:
                raise UsageError("the multipart body ended before its closing boundary")
            self._parser.write(chunk)
        return self._events.popleft()
