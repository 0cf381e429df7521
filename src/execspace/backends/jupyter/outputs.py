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

from ...models import PutFile
from ...process.capture import HeadTailBuffer

__all__ = ["MIME_FILES", "CellOutputs", "strip_ansi"]

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

#: Files one cell may write; a cell that displays in a loop must not fill the disk.
MAX_FILES_PER_CELL = 50

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")


def strip_ansi(text: str) -> str:
    """IPython colours tracebacks; the reader of the result is a model or a log, not a terminal."""
    return _ANSI.sub("", text)


@dataclass(slots=True)
class CellOutputs:
    """Collects one cell's output messages."""

    cell: int
    limit: int | None
    text: HeadTailBuffer = field(init=False)
    stdout: HeadTailBuffer = field(init=False)
    stderr: HeadTailBuffer = field(init=False)
    files: list[PutFile] = field(default_factory=list)
    error: tuple[str, str] | None = None
    """(name, value) of the exception the cell raised."""
    dropped: int = 0
    _outputs: int = 0

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
        if len(self.files) >= MAX_FILES_PER_CELL:
            self.dropped += 1
            return None
        ext, is_b64 = MIME_FILES[mime]
        name = f"out/cell-{self.cell}-{self._outputs}{ext}"
        self.files.append(PutFile(name, _decode(payload, is_b64=is_b64, is_json=mime == "application/json")))
        return name

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
