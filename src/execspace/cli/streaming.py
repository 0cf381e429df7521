"""Show a program's output on our terminal as it comes, and feed it our stdin."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import sys
from collections.abc import AsyncIterator, Awaitable
from dataclasses import replace
from typing import BinaryIO

from ..errors import UsageError
from ..models import OutputChunk, RunProgramSpec, RunResult, Workspace
from ..protocols import ProgramHandle, ProgramRunner
from .console import warn
from .signals import CommandSignals

__all__ = ["SignalForwarder", "run_program", "stdin_source"]


class _Sink:
    """Writes chunks to our stdout/stderr as raw bytes and counts what went out."""

    def __init__(self) -> None:
        self.written = {"stdout": 0, "stderr": 0}
        self.stdout_closed = False
        self.stderr_head = b""

    def write(self, chunk: OutputChunk) -> None:
        self.written[chunk.stream] += len(chunk.data)
        if chunk.stream == "stderr" and len(self.stderr_head) < len(_OURS):
            self.stderr_head += chunk.data[: len(_OURS)]
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

    def explain(self, result: RunResult) -> None:
        """A program that could not be started: the wrapper's own line (bwrap's) went out live, and the result
        carries our explanation instead, which the user must see too."""
        ours = result.raw_stderr.startswith(_CANNOT_EXECUTE)
        if result.exit_code in (126, 127) and ours and not self.stderr_head.startswith(_OURS):
            _write(sys.stderr.buffer, result.raw_stderr)


_OURS = b"execspace: "
_CANNOT_EXECUTE = _OURS + b"cannot execute"


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


_STDIN_CHUNK = 64 * 1024


def stdin_source(disabled: bool) -> int | None:
    """The fd of our stdin when it is a pipe, socket or file the program should read; None for a terminal (the
    program gets an empty stdin) or when disabled."""
    if disabled or sys.stdin is None:
        return None
    try:
        fd = sys.stdin.fileno()
        return None if os.isatty(fd) else fd
    except (OSError, ValueError):
        return None


async def _chunks(fd: int) -> AsyncIterator[bytes]:
    """What arrives on ``fd``, as it arrives, until end of file: never the whole of it first."""
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        # a file or a device such as /dev/null (epoll takes neither): read in a thread, chunk by chunk
        while chunk := await asyncio.to_thread(os.read, fd, _STDIN_CHUNK):
            yield chunk
        return
    reader = asyncio.StreamReader(limit=_STDIN_CHUNK)
    loop = asyncio.get_running_loop()
    # a duplicate: the transport closes what it was given, and our fd 0 must stay
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(os.dup(fd), "rb", 0)
    )
    try:
        while chunk := await reader.read(_STDIN_CHUNK):
            yield chunk
    finally:
        transport.close()
        # the duplicate shares the file status flags: whoever else reads this pipe gets it back blocking
        with contextlib.suppress(OSError):
            os.set_blocking(fd, True)


async def _feed(handle: ProgramHandle, source: int | None) -> None:
    # the program may exit without reading: a closed pipe is not our error
    with contextlib.suppress(UsageError, OSError):
        if source is not None:
            async for chunk in _chunks(source):
                await handle.write_stdin(chunk)
        await handle.close_stdin()


class SignalForwarder:
    """A signal routed to a running program goes to the program first; if it still runs ``grace`` seconds later,
    or at a second signal, its tree is killed. The command then reports as usual."""

    def __init__(self, grace: float) -> None:
        self._handle: ProgramHandle | None = None
        self._grace = grace
        self._tasks: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self.received: list[signal.Signals] = []
        self.killed = False

    def cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _spawn(self, step: Awaitable[None]) -> None:
        task = asyncio.ensure_future(step)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def attach(self, handle: ProgramHandle) -> None:
        """The program has started: what came while it was being started is delivered now."""
        self._handle = handle
        if self.received:
            self._deliver()

    def on_signal(self, sig: signal.Signals) -> None:
        self.received.append(sig)
        if self._handle is not None:
            self._deliver()

    def _deliver(self) -> None:
        assert self._handle is not None
        if len(self.received) > 1:
            self._kill()
        elif self._timer is None:
            self._spawn(self._handle.signal(self.received[0]))
            self._timer = asyncio.get_running_loop().call_later(self._grace, self._kill)

    def _kill(self) -> None:
        if not self.killed and self._handle is not None:
            self.killed = True
            self._spawn(self._handle.kill())

    def reason(self) -> str | None:
        """One line on what the signals did, for the report (None when none came)."""
        if not self.received:
            return None
        name = self.received[0].name
        if self.killed:
            return f"interrupted by {name}: sent to the program, which was then killed"
        return f"interrupted by {name}: sent to the program, which exited on its own"


async def run_program(
    runner: ProgramRunner,
    ws: Workspace,
    spec: RunProgramSpec,
    stdin: int | None,
    *,
    live: bool,
    grace: float,
    signals: CommandSignals,
) -> tuple[RunResult, str | None]:
    """Run ``spec`` with our stdin streamed to it, its output copied to our stdout/stderr live when ``live``;
    return the result and, when a signal came, the line that says what it did.

    When our stdout is closed by its reader the program is killed, as SIGPIPE would.
    """
    sink = _Sink()
    forwarder = SignalForwarder(grace)
    # routed before the start: a signal that comes while the program is being started is the program's too
    with signals.routed(forwarder.on_signal):
        handle = await runner.start_program(ws, replace(spec, stdin=None))
        forwarder.attach(handle)
        async with handle:
            feeder = asyncio.create_task(_feed(handle, stdin))
            try:
                if live:
                    await _show(handle, sink)
                result = await handle.wait()
            finally:
                forwarder.cancel_timer()
                feeder.cancel()
                await asyncio.gather(feeder, return_exceptions=True)
    if live:
        sink.replay_missed(result)
        sink.explain(result)
    return result, forwarder.reason()


async def _show(handle: ProgramHandle, sink: _Sink) -> None:
    killed = False
    async for chunk in handle.stream():
        sink.write(chunk)
        if sink.stdout_closed and not killed:
            killed = True
            await handle.kill()
