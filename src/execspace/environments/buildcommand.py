"""One build command run to its end, each line of its output handed on as it comes: what an environment's steps and
``execspace image build`` show while they work, and what their failures quote."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence

__all__ = ["run_command"]


async def run_command(
    argv: Sequence[str],
    on_line: Callable[[str], None],
    *,
    env: Mapping[str, str] | None = None,
    umask: int = -1,
) -> tuple[int, list[str]]:
    """Run ``argv`` (no stdin; stderr into stdout), ``on_line`` called with each line; its exit code and every line.
    A cancelled caller kills it and waits for it, so no build command outlives what started it."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
        umask=umask,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        async for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            lines.append(line)
            on_line(line)
        return await proc.wait(), lines
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
