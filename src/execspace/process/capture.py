"""Bounded output capture: keep the head and the tail, count the middle."""

from __future__ import annotations

__all__ = ["HeadTailBuffer", "clip_text", "truncation_marker"]


def truncation_marker(omitted: int) -> bytes:
    return f"\n[... execspace: {omitted} bytes omitted ...]\n".encode()


class HeadTailBuffer:
    """Keeps at most ``limit`` bytes of a stream: the first half and the last half.

    Memory stays bounded whatever the program prints; ``total`` counts every byte.
    ``limit=None`` keeps everything (only for callers that bound the stream otherwise).
    """

    __slots__ = ("_head", "_head_cap", "_tail", "_tail_cap", "limit", "total")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.total = 0
        self._head = bytearray()
        self._tail = bytearray()
        self._head_cap = limit // 2 if limit is not None else -1
        self._tail_cap = limit - self._head_cap if limit is not None else 0

    @property
    def truncated(self) -> bool:
        return self.limit is not None and self.total > self.limit

    def write(self, data: bytes) -> None:
        self.total += len(data)
        if self.limit is None:
            self._head += data
            return
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if not data or self._tail_cap == 0:
            return
        if len(data) >= self._tail_cap:
            self._tail[:] = data[-self._tail_cap :]
            return
        self._tail += data
        # trim lazily so that many small writes cost amortised O(1)
        if len(self._tail) > 2 * self._tail_cap:
            del self._tail[: len(self._tail) - self._tail_cap]

    def getvalue(self) -> bytes:
        """The kept bytes, with a marker where the middle was dropped (cut on UTF-8 boundaries)."""
        tail = bytes(self._tail[-self._tail_cap :]) if self._tail_cap else b""
        if not self.truncated:
            return bytes(self._head) + tail
        head = _cut_utf8_end(bytes(self._head))
        tail = _cut_utf8_start(tail)
        omitted = self.total - len(head) - len(tail)
        return head + truncation_marker(omitted) + tail


def clip_text(text: str, limit: int) -> tuple[str, bool, int]:
    """Cut ``text`` to ``limit`` UTF-8 bytes as output is captured: head + marker + tail.

    Returns the kept text (with the marker when cut), whether it was cut, and the
    UTF-8 size of the whole ``text``. Characters are never split.
    """
    buf = HeadTailBuffer(limit)
    buf.write(text.encode("utf-8", "replace"))
    return buf.getvalue().decode("utf-8", "replace"), buf.truncated, buf.total


def _cut_utf8_end(data: bytes) -> bytes:
    """Drop an incomplete multi-byte character at the end."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b < 0x80:
            return data
        if b >= 0xC0:  # a lead byte: keep it only if its sequence is complete
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return data if back >= need else data[:-back]
    return data


def _cut_utf8_start(data: bytes) -> bytes:
    """Drop continuation bytes of a character whose start was cut off."""
    i = 0
    while i < min(3, len(data)) and 0x80 <= data[i] < 0xC0:
        i += 1
    return data[i:]
