"""Show a program's output on our terminal as it comes, and feed it our stdin."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from dataclasses import replace
from typing import BinaryIO

from ..errors import UsageError
from ..models import OutputChunk, RunProgramSpec, RunResult, Workspace
from ..protocols import ProgramHandle, ProgramRunner
from .console import warn

__all__ = ["stream_program"]


class _Sink:
    """Writes chunks to our stdout/stderr as raw bytes and counts what went out."""

    def __init__(self) -> None:
        self.written = {"stdout": 0, "stderr": 0}
        self.stdout_closed = False

    def write(self, chunk: OutputChunk) -> None:
        self.written[chunk.stream] += len(chunk.data)
        if chunk.stream == "stdout":
            if not self.stdout_closed:
                self.stdout_closed = not _write(sys.stdout.buffer, chunk.data)
        else:
            _write(sys.stderr.buffer, chunk.data)

    def replay_missed(self, result: RunResult) -> None:
        """Show output that the live stream did not deliver.

        A handle may replay only a bounded backlog of what came before ``stream()``
        was first awaited (or, per the protocol, none of it). What was missed is a
        prefix of each stream, still in the result unless that was truncated.
        """
        streams = (
            (
                "stdout",
                sys.stdout.buffer,
                result.raw_stdout,
                result.stdout_total_bytes,
                result.stdout_truncated,
            ),
            (
                "stderr",
                sys.stderr.buffer,
                result.raw_stderr,
                result.stderr_total_bytes,
                result.stderr_truncated,
            ),
        )
        for name, target, raw, total, truncated in streams:
            missed = total - self.written[name]
            if missed <= 0 or (name == "stdout" and self.stdout_closed):
                continue
            if truncated:
                warn(f"the first {missed} bytes of the program's {name} were not shown (use --json)")
            elif self.written[name] == 0:
                _write(target, raw)
            else:
                warn(f"the first {missed} bytes of the program's {name} came before streaming began; here:")
                _write(target, raw[:missed])


def _write(target: BinaryIO, data: bytes) -> bool:
    """Write and flush; False when the reader went away (``| head``)."""
    try:
        target.write(data)
        target.flush()
    except BrokenPipeError:
        # point the fd at /dev/null so the interpreter's final flush does not complain
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, target.fileno())
        os.close(devnull)
        return False
    return True


async def _feed(handle: ProgramHandle, data: bytes | None) -> None:
    # the program may exit without reading: a closed pipe is not our error
    with contextlib.suppress(UsageError, OSError):
        if data:
            await handle.write_stdin(data)
        await handle.close_stdin()


async def stream_program(runner: ProgramRunner, ws: Workspace, spec: RunProgramSpec, stdin: bytes | None) -> RunResult:
    """Run ``spec``, copying its output to our stdout/stderr live; return the result.

    ``stdin`` is written to the program and then closed (``None``: closed at once).
    When our stdout is closed by its reader the program is killed, as SIGPIPE would.
    """
    handle = await runner.start_program(ws, replace(spec, stdin=None))
    sink = _Sink()
    async with handle:
        feeder = asyncio.create_task(_feed(handle, stdin))
        killed = False
        try:
            async for chunk in handle.stream():
                sink.write(chunk)
                if sink.stdout_closed and not killed:
                    killed = True
                    await handle.kill()
            result = await handle.wait()
        finally:
            feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)
    sink.replay_missed(result)
    return result
