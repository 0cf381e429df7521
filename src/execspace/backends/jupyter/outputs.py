"""Turn a cell's Jupyter messages into bounded text and files under ``out/``.

Text (stdout, stderr, ``text/plain`` results, error tracebacks) is kept in the order the
kernel sent it, capped head+tail like a program's output. Rich data becomes files with
names that do not depend on timing: ``out/cell-<n>-<k>.<ext>`` for output ``k`` of cell ``n``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field
from typing import Any

from ...errors import InvalidSpec
from ...models import PutFile
from ...process.capture import HeadTailBuffer

__all__ = ["MIME_FILES", "OUTPUT_BOUNDS", "CellOutputs", "RichOutputLimits", "strip_ansi"]

#: mime type → (file extension, payload is base64)
MIME_FILES: dict[str, tuple[str, bool]] = {
    "image/png": (".png", True),
    "image/jpeg": (".jpg", True),
    "image/gif": (".gif", True),
    "application/pdf": (".pdf", True),
    "image/svg+xml": (".svg", False),
    "text/html": (".html", False),
    "text/markdown": (".md", False),
    "text/latex": (".tex", False),
    "application/json": (".json", False),
}

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class RichOutputLimits:
    """How much rich output one cell may leave under ``out/``, and how large one kernel message may be: a
    cell that displays in a loop must not fill the disk, nor one huge output the shared host process's memory.
    What is over a limit is dropped, and the cell's text says so."""

    files_per_cell: int = 50
    bytes_per_cell: int = 64 * MiB
    """Decoded bytes of all files of one cell."""
    message_bytes: int = 32 * MiB
    """Largest frame (in practice: one message's content) taken from a sandboxed kernel; a larger one is
    refused by our sockets, which ends that kernel (libzmq drops the connection for good)."""

    def __post_init__(self) -> None:
        if min(self.files_per_cell, self.bytes_per_cell) < 0 or self.message_bytes < MiB:
            raise InvalidSpec(
                "RichOutputLimits: files_per_cell and bytes_per_cell must be >= 0 (0 saves no files) and "
                "message_bytes at least 1 MiB (a kernel's ordinary replies must fit)"
            )

    def describe(self) -> str:
        return (
            f"at most {self.files_per_cell} files and {self.bytes_per_cell} bytes of rich output per cell, the rest "
            f"dropped with a note; sandboxed kernels: messages up to {self.message_bytes} bytes (a larger one ends "
            "the kernel)"
        )


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")


def strip_ansi(text: str) -> str:
    """IPython colours tracebacks; the reader of the result is a model or a log, not a terminal."""
    return _ANSI.sub("", text)


@dataclass(slots=True)
class CellOutputs:
    """Collects one cell's output messages."""

    cell: int
    limit: int | None
    rich: RichOutputLimits = field(default_factory=RichOutputLimits)
    text: HeadTailBuffer = field(init=False)
    stdout: HeadTailBuffer = field(init=False)
    stderr: HeadTailBuffer = field(init=False)
    files: list[PutFile] = field(default_factory=list)
    """Rich outputs not yet written (:meth:`take_files`)."""
    saved: list[str] = field(default_factory=list)
    """Workspace paths of every rich output of the cell, written or about to be."""
    error: tuple[str, str] | None = None
    """(name, value) of the exception the cell raised."""
    dropped: int = 0
    dropped_bytes: int = 0
    _outputs: int = 0
    _bytes: int = 0

    def __post_init__(self) -> None:
        self.text = HeadTailBuffer(self.limit)
        self.stdout = HeadTailBuffer(self.limit)
        self.stderr = HeadTailBuffer(self.limit)

    def add(self, msg_type: str, content: dict[str, Any]) -> None:
        """Take one iopub message of this cell."""
        if msg_type == "stream":
            self._write(str(content.get("text", "")), stderr=content.get("name") == "stderr")
        elif msg_type in ("execute_result", "display_data"):
            self._bundle(content.get("data") or {})
        elif msg_type == "error":
            self._error(content)

    def take_files(self) -> list[PutFile]:
        """The rich outputs to write now; the cell keeps only their names (large outputs are not held)."""
        files, self.files = self.files, []
        return files

    def note(self, line: str) -> None:
        """A line from execspace itself (timeouts, restarts), kept with the output."""
        self._write(f"[{line}]\n", stderr=True)

    def _write(self, text: str, *, stderr: bool) -> None:
        data = text.encode("utf-8", "replace")
        self.text.write(data)
        (self.stderr if stderr else self.stdout).write(data)

    def _bundle(self, data: dict[str, Any]) -> None:
        self._outputs += 1
        saved = [self._file(mime, payload) for mime, payload in data.items() if mime in MIME_FILES]
        names = [name for name in saved if name is not None]
        plain = data.get("text/plain")
        if isinstance(plain, str) and plain:
            self._write(plain if plain.endswith("\n") else plain + "\n", stderr=False)
        if names:
            self._write(f"[saved {', '.join(names)}]\n", stderr=False)
        skipped = sorted(set(data) - set(MIME_FILES) - {"text/plain"})
        if skipped and not names and not plain:
            self._write(f"[output of type {', '.join(skipped)} not shown]\n", stderr=False)

    def _file(self, mime: str, payload: Any) -> str | None:
        if len(self.saved) >= self.rich.files_per_cell:
            self.dropped += 1
            return None
        ext, is_b64 = MIME_FILES[mime]
        data = _decode(payload, is_b64=is_b64, is_json=mime == "application/json")
        if self._bytes + len(data) > self.rich.bytes_per_cell:
            self.dropped += 1
            self.dropped_bytes += len(data)
            return None
        self._bytes += len(data)
        name = f"out/cell-{self.cell}-{self._outputs}{ext}"
        self.files.append(PutFile(name, data))
        self.saved.append(name)
        return name

    def drop_note(self) -> str | None:
        """What the caller is told about the rich outputs that were not saved, if any."""
        if not self.dropped:
            return None
        over = f", {self.dropped_bytes} bytes over the limit" if self.dropped_bytes else ""
        return (
            f"{self.dropped} more rich outputs of this cell were not saved (at most {self.rich.files_per_cell} files "
            f"and {self.rich.bytes_per_cell} bytes per cell{over})"
        )

    def _error(self, content: dict[str, Any]) -> None:
        name, value = str(content.get("ename", "Error")), str(content.get("evalue", ""))
        self.error = (name, value)
        trace = "\n".join(strip_ansi(str(line)) for line in content.get("traceback") or ())
        self._write((trace or f"{name}: {value}") + "\n", stderr=True)
        if name == "StdinNotImplementedError":
            self.note("input() is not available: the code runs without a terminal; pass data in files or variables")


def _decode(payload: Any, *, is_b64: bool, is_json: bool) -> bytes:
    if is_json:
        return json.dumps(payload, indent=2).encode()
    text = "".join(payload) if isinstance(payload, list) else str(payload)
    if is_b64:
        try:
            return base64.b64decode(text, validate=False)
        except (binascii.Error, ValueError):
            pass  # keep what the kernel sent rather than lose the output
    return text.encode("utf-8", "replace")


#: Text of the kernel launchers (:mod:`.sandboxed`'s and :mod:`.programkernel`'s): ``bound_outputs(app, limit)`` makes a
#: kernel send no message over ``limit`` bytes (a bigger output becomes a note, a long print goes in pieces).
OUTPUT_BOUNDS = r"""
def bound_outputs(app, limit):
    serialize = app.session.serialize

    def bounded(msg, ident=None):
        # a frame over the host's limit would end this kernel's connection: its outputs become a note instead
        frames = serialize(msg, ident)
        size = max(map(len, frames))
        if size <= limit:
            return frames
        note = f"[an output of {size} bytes was not sent: over max_message_bytes ({limit})]"
        small = {
            "stream": {"text": note + "\n"},
            "error": {"evalue": note, "traceback": [note]},
        }.get(msg["msg_type"], {"data": {"text/plain": note}, "metadata": {}})
        return serialize({**msg, "content": {**msg["content"], **small}}, ident)

    def split(stream, chars):
        # long prints go out in pieces rather than as one message over the host's limit
        def hook(msg):
            text = msg["content"]["text"]
            if len(text) <= chars:
                return msg
            for i in range(0, len(text), chars):
                content = {**msg["content"], "text": text[i : i + chars]}
                part = stream.session.msg("stream", content, parent=msg["parent_header"])
                stream.session.send(stream.pub_thread, part, ident=stream.topic)
            return None
        return hook

    app.session.serialize = bounded
    for stream in (sys.stdout, sys.stderr):
        stream.register_hook(split(stream, limit // 8))  # UTF-8 and JSON escapes: 6 bytes at most
"""
