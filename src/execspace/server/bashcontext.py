"""bash contexts of the code interpreter: one bash per context, in the sandbox's own session, running each cell in
the same shell so that its working directory, variables, functions and options carry over to the next cell.

Cells come in on the shell's stdin as NUL-terminated records (a cell's id, what sets its ``env_vars``, its code,
what restores them), which the driver reads from a descriptor of its own: the cell's commands read ``/dev/null``.
Each cell's end is a mark, ``RS <id> <status> LF``, written after it on both stdout and stderr, so that the cell's
output on each stream is complete when its mark arrives. Everything else the shell writes is the cell's output
(untrusted: a mark naming another cell, one that was cut off, is dropped; a forged one can only end its own cell).
"""

from __future__ import annotations

import codecs
import re
import shlex
from collections.abc import Mapping
from typing import Any

from ..errors import UsageError
from ..protocols import ProgramHandle, ProgramRunner
from .cellprocess import CellProcess, now
from .lines import error_line
from .sandboxes import Sandbox

__all__ = ["BashContext"]

#: Reads the cells from fd 3 (the commands get /dev/null), runs each with ``eval`` in the shell itself, and marks its
#: end. An interrupt (SIGINT) stops the running command; the trap keeps the shell, which goes on with the cell.
_DRIVER = r"""exec 3<&0 0</dev/null
trap ':' INT
while IFS= read -r -d '' __execspace_id <&3 && IFS= read -r -d '' __execspace_set <&3 &&
      IFS= read -r -d '' __execspace_code <&3 && IFS= read -r -d '' __execspace_reset <&3; do
  eval "$__execspace_set"
  eval "$__execspace_code"
  __execspace_status=$?
  eval "$__execspace_reset"
  printf '\036%s %d\n' "$__execspace_id" "$__execspace_status"
  printf '\036%s %d\n' "$__execspace_id" "$__execspace_status" >&2
done
"""
_MARK = re.compile(rb"\x1e([0-9a-f]{16}) (\d{1,3})\n")
#: Longest mark: a partial one this long at the end of a chunk is kept back for the next chunk.
_MARK_BYTES = 1 + 16 + 1 + 3 + 1
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Output:
    """Text of a stream (stdout or stderr)."""

    __slots__ = ("stream", "text")

    def __init__(self, stream: str, text: str) -> None:
        self.stream, self.text = stream, text


class _Mark:
    """A cell's end on one stream, with the cell's exit status."""

    __slots__ = ("cell", "status", "stream")

    def __init__(self, stream: str, cell: str, status: int) -> None:
        self.stream, self.cell, self.status = stream, cell, status


_END = _Output("stderr", "")


class BashContext(CellProcess[_Output | _Mark]):
    """A started bash and what it writes."""

    DIED = "the bash context's shell exited (a cell's exit ends it); the next cell starts a fresh one, state lost"

    def __init__(self, handle: ProgramHandle) -> None:
        super().__init__(handle, _END)
        self._marks: dict[str, int] = {}
        """The running cell's exit status, by the stream its mark came on (it ends once both came)."""
        self._pending = {"stdout": b"", "stderr": b""}
        self._decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in self._pending}

    @classmethod
    async def start(cls, runner: ProgramRunner, sandbox: Sandbox, cwd: str) -> BashContext:
        args = ("--noprofile", "--norc", "-c", _DRIVER)
        return cls(await runner.start_program(sandbox.workspace, sandbox.context_process("bash", args, cwd, _TAG)))

    def _request(self, cell_id: str, code: str, env_vars: Mapping[str, str]) -> bytes:
        self._marks.clear()
        return _request(cell_id, code, env_vars)

    def _lines(self, cell_id: str, item: _Output | _Mark) -> tuple[list[dict[str, Any]], bool]:
        if isinstance(item, _Output):
            if not item.text or item.stream in self._marks:  # after its mark: a background job's, dropped
                return [], False
            return [{"type": item.stream, "text": item.text, "timestamp": now()}], False
        if item.cell == cell_id:  # another's is a cell's that was cut off
            self._marks[item.stream] = item.status
        return [], len(self._marks) == 2

    def _closing_lines(self) -> list[dict[str, Any]]:
        """An ``ExitCode`` error when the cell ended with a status other than 0."""
        status = self._marks["stdout"]
        return [error_line("ExitCode", str(status), f"the cell exited with status {status}")] if status else []

    def _feed(self, stream: str, data: bytes) -> None:
        pending = self._pending[stream] + data
        while (mark := _MARK.search(pending)) is not None:
            self._text(stream, pending[: mark.start()])
            self._put(_Mark(stream, mark[1].decode(), int(mark[2])), len(mark[0]), output=False)
            pending = pending[mark.end() :]
        start = pending.rfind(b"\x1e", max(0, len(pending) - _MARK_BYTES))
        keep = start >= 0 and b"\n" not in pending[start:]  # maybe the start of a mark
        self._text(stream, pending[:start] if keep else pending)
        self._pending[stream] = pending[start:] if keep else b""

    def _flush(self) -> None:
        for stream, rest in self._pending.items():
            self._text(stream, rest)

    def _text(self, stream: str, data: bytes) -> None:
        text = self._decoders[stream].decode(data)
        if text:
            self._put(_Output(stream, text), len(data), output=True)


_TAG = "execspace-bash-context"


def _request(cell_id: str, code: str, env_vars: Mapping[str, str]) -> bytes:
    """The cell's records; its ``env_vars`` are exported before it and put back as they were after it."""
    for name in env_vars:
        if not _NAME.fullmatch(name):
            raise UsageError(f"env var name {name!r} is not a shell variable name: use letters, digits and _")
    saved = {name: f"__execspace_saved_{name}" for name in env_vars}
    set_env = "".join(
        f'{keep}=("${{{name}+set}}" "${{{name}-}}"); export {name}={shlex.quote(env_vars[name])}\n'
        for name, keep in saved.items()
    )
    reset = "".join(
        f'if [ -n "${{{keep}[0]}}" ]; then export {name}="${{{keep}[1]}}"; else unset {name}; fi; unset {keep}\n'
        for name, keep in saved.items()
    )
    return b"".join(part.encode() + b"\0" for part in (cell_id, set_env, code.replace("\0", ""), reset))
