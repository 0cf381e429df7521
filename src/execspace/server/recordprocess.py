"""Process contexts whose output is the running cell's own text with records in it (bash, R, Java).

A record is one line, ``RS <cell> <kind>[ <field>]… LF``: the cell's id (16 hex digits), a kind (lower-case
letters) and fields of hex digits (a text's UTF-8 bytes in hex, or a bash cell's status in decimal). The kinds:

- ``done``: the cell ended; written on stdout and on stderr, so that the cell's output on each stream is complete
  when its record arrives (bash adds the cell's status);
- ``result`` / ``display``: a value, the cell's own (its last expression's) or one shown on the way (R), as text;
- ``error``: the cell's error, its name, value and traceback;
- ``stdout`` / ``stderr``: a piece of output the process wrote through its own streams (Java's ``System.out``
  keeps the pieces of its writes apart, as E2B's Java kernel does).

Everything else is the running cell's plain output, passed on by whole lines: the start of a line waits at most
:data:`HOLD` for its end. All of it is the program's output, hence untrusted: a record naming another cell (one
that was cut off) is dropped, a forged one can only end or add to its own cell, and a line that merely looks like
the start of a record is held back only until its line ends or it outgrows :data:`MAX_RECORD`.

Cells go the other way as messages of length-prefixed fields (:func:`message`), except bash's (NUL-terminated
records, which ``read -d ''`` takes).
"""

from __future__ import annotations

import asyncio
import codecs
import re
from collections.abc import Mapping
from typing import Any

from ..protocols import ProgramHandle
from .cellprocess import CellProcess, now
from .lines import error_line

__all__ = ["MAX_RECORD", "MAX_TEXT", "RecordProcess", "message"]

_RECORD = re.compile(rb"\x1e([0-9a-f]{16}) ([a-z]{1,8})((?: [0-9a-f]*){0,3})\n")
#: What the start of a record may look like before its line ends (held back for the next chunk).
_PARTIAL = re.compile(rb"\x1e[0-9a-f]{0,16}(?: [a-z]{0,8}(?: [0-9a-f]*){0,3})?")
#: What more of a record's start may be, short of its end.
_CONTINUED = re.compile(rb"[0-9a-z ]*")
#: Bytes of a text in a record: the drivers cut a longer one (rrepl.R and javarepl.java say it again).
MAX_TEXT = 4 * 1024 * 1024
#: Bytes of one record (an error's three texts in hex, and the rest); a longer "record" is plain output.
MAX_RECORD = 3 * 2 * MAX_TEXT + 1024
#: Seconds the start of a line waits for its end, so that a line written in pieces (R prints a value in several
#: writes) is one piece of output, while a line that stays unfinished still goes out live.
HOLD = 0.2
#: Characters of an unfinished line held back at most.
_HOLD_CHARS = 64 * 1024


def message(*fields: str) -> bytes:
    """A message to a driver: its number of fields, then each field's UTF-8 bytes, each number in ten digits."""
    encoded = [field.replace("\0", "").encode() for field in fields]
    parts = [b"%010d" % len(encoded)]
    for data in encoded:
        parts += (b"%010d" % len(data), data)
    return b"".join(parts)


class _Output:
    """Text of a stream (stdout or stderr); ``cell``: the cell a ``stdout``/``stderr`` record named (None: plain)."""

    __slots__ = ("cell", "stream", "text")

    def __init__(self, stream: str, text: str, cell: str | None = None) -> None:
        self.stream, self.text, self.cell = stream, text, cell


class _Record:
    """A record other than output: a cell's end, value or error."""

    __slots__ = ("cell", "fields", "kind", "stream")

    def __init__(self, stream: str, cell: str, kind: str, fields: list[str]) -> None:
        self.stream, self.cell, self.kind, self.fields = stream, cell, kind, fields


_END = _Output("stderr", "")


class RecordProcess(CellProcess[_Output | _Record]):
    """A started context process and the records and text it writes."""

    def __init__(self, handle: ProgramHandle) -> None:
        super().__init__(handle, _END)
        self._done: dict[str, list[str]] = {}
        """The running cell's ``done`` records' fields, by the stream they came on (it ends once both came)."""
        self._pending = {"stdout": b"", "stderr": b""}
        """Bytes that may be the start of a record, by stream."""
        self._decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in self._pending}
        self._unfinished = {"stdout": "", "stderr": ""}
        """Plain text of a line not ended yet, by stream, held back for at most HOLD seconds."""
        self._holds: dict[str, asyncio.TimerHandle] = {}

    def _lines(self, cell_id: str, item: _Output | _Record) -> tuple[list[dict[str, Any]], bool]:
        if item.cell not in (None, cell_id):  # another's is a cell's that was cut off
            return [], False
        if isinstance(item, _Output):
            if not item.text or item.stream in self._done:  # after its end: a background job's, dropped
                return [], False
            return [{"type": item.stream, "text": item.text, "timestamp": now()}], False
        if item.kind == "done":
            self._done[item.stream] = item.fields
            return [], len(self._done) == 2
        texts = [_text(field) for field in item.fields]
        if item.kind in ("result", "display") and texts:
            return [{"type": "result", "text": texts[0], "is_main_result": item.kind == "result"}], False
        if item.kind == "error" and len(texts) == 3:
            return [error_line(*texts)], False
        return [], False

    def _request(self, cell_id: str, code: str, env_vars: Mapping[str, str]) -> bytes:
        self._done.clear()
        return self._message(cell_id, code, env_vars)

    def _message(self, cell_id: str, code: str, env_vars: Mapping[str, str]) -> bytes:
        """What starts the cell in the process."""
        raise NotImplementedError

    def _feed(self, stream: str, data: bytes) -> None:
        pending = self._pending[stream] + data
        if self._pending[stream] and len(pending) <= MAX_RECORD and _CONTINUED.fullmatch(data) is not None:
            self._pending[stream] = pending  # more of one record's start: nothing new to look at (no rescan)
            return
        done = 0
        for found in _RECORD.finditer(pending):
            self._text(stream, pending[done : found.start()])
            self._release(stream)  # what came before the record goes before it
            self._record(stream, found, found.end() - found.start())
            done = found.end()
        start = pending.rfind(b"\x1e", done)
        keep = start >= 0 and len(pending) - start <= MAX_RECORD and _PARTIAL.fullmatch(pending, start) is not None
        self._text(stream, pending[done:start] if keep else pending[done:])
        self._pending[stream] = pending[start:] if keep else b""

    def _record(self, stream: str, found: re.Match[bytes], size: int) -> None:
        cell, kind = found[1].decode(), found[2].decode()
        fields = found[3].decode()[1:].split(" ") if found[3] else []
        if kind in ("stdout", "stderr"):  # output: in order with the plain text of its stream, dropped past MAX_AHEAD
            if len(fields) == 1 and len(fields[0]) % 2 == 0:
                text = self._decoders[stream].decode(bytes.fromhex(fields[0]))
                self._put(_Output(kind, text, cell), size, output=True)
            return
        self._put(_Record(stream, cell, kind, fields), size, output=False)

    def _flush(self) -> None:
        for stream, rest in self._pending.items():
            self._text(stream, rest)
            self._release(stream)

    def _text(self, stream: str, data: bytes) -> None:
        """Plain output: its whole lines at once, the start of one held back until its end comes (or HOLD passed)."""
        text = self._unfinished[stream] + self._decoders[stream].decode(data)
        end = text.rfind("\n") + 1
        if len(text) - end > _HOLD_CHARS:
            end = len(text)
        if end and (hold := self._holds.pop(stream, None)) is not None:
            hold.cancel()  # the held line ended
        self._emit(stream, text[:end])
        self._unfinished[stream] = text[end:]
        if text[end:] and stream not in self._holds:  # the wait starts with the line: a trickle does not extend it
            self._holds[stream] = asyncio.get_running_loop().call_later(HOLD, self._release, stream)

    def _release(self, stream: str) -> None:
        """Put the held start of a line as it is."""
        hold = self._holds.pop(stream, None)
        if hold is not None:
            hold.cancel()
        text, self._unfinished[stream] = self._unfinished[stream], ""
        self._emit(stream, text)

    def _emit(self, stream: str, text: str) -> None:
        if text:
            self._put(_Output(stream, text), len(text.encode()), output=True)


def _text(field: str) -> str:
    """A record's text field (hex of UTF-8 bytes); a malformed one reads as it is."""
    try:
        return bytes.fromhex(field).decode("utf-8", "replace")
    except ValueError:
        return field
