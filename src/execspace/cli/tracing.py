"""A CLI command's trace: the tracer the ``OTEL_*`` variables ask for, the command's root span, and the export of
every span before the command returns (the process exits right after it)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

from ..tracing import from_environment

__all__ = ["traced_command"]


@contextlib.asynccontextmanager
async def traced_command(command: str, options: Mapping[str, object]) -> AsyncIterator[Mapping[str, object]]:
    """The engine's ``options`` with the command's tracer, inside the command's span (``execspace <command>``:
    what the engine does are its children, one trace); unchanged when the variables ask for no traces."""
    tracer = from_environment("execspace")
    if tracer is None:
        yield options
        return
    try:
        with tracer.span(f"execspace {command}", {"execspace.command": command}):
            yield {**options, "tracer": tracer}
    finally:
        await asyncio.to_thread(tracer.close)  # exported now: nothing is left to a thread the exit would cut off
