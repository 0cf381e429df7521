"""The jupyter backend's ProgramKernel through its public face: a real ipykernel started as a program of a (local)
workspace, its channels relayed over the program's stdin and stdout; and its frames handled as untrusted input."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

import pytest

from execspace import BaseEngine, RunProgramSpec, Workspace

pytest.importorskip("ipykernel")

from execspace.backends.jupyter import Interpreter, ProgramKernel, find_interpreter


def _spec_of(cmd: str, args: Sequence[str]) -> RunProgramSpec:
    return RunProgramSpec(cmd, tuple(args), timeout=None, tag="program-kernel")


async def _cell(kernel: ProgramKernel, code: str, within: float = 30.0) -> list[dict[str, Any]]:
    """The iopub messages of one cell, until the kernel says it is idle."""
    msg_id = kernel.execute(code)
    deadline = time.monotonic() + within
    found = []
    while (remaining := deadline - time.monotonic()) > 0:
        msg = await kernel.next_iopub(remaining)
        assert msg is not None, "the kernel went quiet"
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["header"]["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return found
        found.append(msg)
    raise AssertionError(f"no idle within {within} s: {found}")


async def test_a_kernel_started_as_a_program_runs_cells_and_is_interrupted(engine: BaseEngine, ws: Workspace) -> None:
    python = find_interpreter()
    assert isinstance(python, Interpreter), python
    kernel = await ProgramKernel.start(engine.runner, ws, _spec_of, python, timeout=30)
    try:
        printed = await _cell(kernel, "x = 6 * 7\nprint(x)")
        # ipykernel sends what a print wrote in one or more stream messages, as its flush timer falls
        assert "".join(m["content"]["text"] for m in printed if m["header"]["msg_type"] == "stream") == "42\n"
        assert "program-kernel" in [p.tag for p in await engine.runner.list_programs(ws)]

        msg_id = kernel.execute("import time\nprint('asleep', flush=True)\ntime.sleep(60)")
        while (msg := await kernel.next_iopub(10)) is not None:  # the cell runs its code: a SIGINT raises there
            if msg["header"]["msg_type"] == "stream" and msg["parent_header"]["msg_id"] == msg_id:
                break
        await kernel.interrupt()
        errors = []
        while (msg := await kernel.next_iopub(10)) is not None:
            if msg["header"]["msg_type"] == "error":
                errors.append(msg["content"]["ename"])
            if msg["header"]["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        assert errors == ["KeyboardInterrupt"]
        kept = await _cell(kernel, "print(x)")  # interrupted, its state kept
        assert "".join(m["content"]["text"] for m in kept if m["header"]["msg_type"] == "stream") == "42\n"
    finally:
        await kernel.stop()
    assert not await kernel.is_alive()
    result = await asyncio.wait_for(kernel.handle.wait(), 10)
    assert result.exit_code != 0  # killed by stop


#: A frame whose signature is wrong (the relay's framing: size, channel, part count, then each part with its size),
#: then, after a line on stdin, a frame header announcing more than any frame may hold.
_FORGER = r"""
import struct, sys
head = struct.Struct("=I")
parts = [b"<IDS|MSG>", b"0" * 64, b"{}", b"{}", b"{}", b"{}"]
body = bytes([1]) + head.pack(len(parts)) + b"".join(head.pack(len(p)) + p for p in parts)
sys.stdout.buffer.write(head.pack(len(body)) + body)
sys.stdout.flush()
sys.stdin.readline()
sys.stdout.buffer.write(head.pack(1 << 30))
sys.stdout.flush()
sys.stdin.readline()
"""


async def test_a_forged_frame_is_dropped_and_an_oversized_one_ends_the_connection(
    engine: BaseEngine, ws: Workspace
) -> None:
    handle = await engine.runner.start_program(ws, _spec_of(sys.executable, ("-c", _FORGER)))
    kernel = ProgramKernel(handle, "k" * 64)
    try:
        assert await kernel.next_iopub(1.0) is None  # its signature failed: nothing was delivered
        assert await kernel.is_alive()
        await handle.write_stdin(b"go\n")
        deadline = time.monotonic() + 10
        while await kernel.is_alive():
            assert time.monotonic() < deadline, "the oversized frame did not end the connection"
            await asyncio.sleep(0.02)
        status, how = await kernel.exit_status()
        assert status is None and "over" in how, how  # the program still runs: the channel broke
    finally:
        await kernel.stop()
    result = await asyncio.wait_for(handle.wait(), 10)
    assert result.exit_code != 0
