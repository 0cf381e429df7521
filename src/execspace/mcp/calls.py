"""What the MCP server knows of one tool call's client, whichever SDK major and protocol revision carried it.

The SDK binding (:mod:`.sdk`) builds a :class:`Caller` from its request context; everything above it (the tools,
the workspaces, Tasks) sees only this value, so the two SDK majors differ in one module each.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["STATELESS_REVISIONS", "TASKS_EXTENSION", "App", "Caller", "Progress"]

#: The revisions without sessions: every request stands alone, and state is reached through explicit handles.
STATELESS_REVISIONS = frozenset({"2026-07-28"})
#: The Tasks extension's identifier (SEP-2663), in a request's client capabilities and the server's.
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"

Progress = Callable[[float, str], Awaitable[None]]
"""Sends one ``notifications/progress`` for the call: how far (seconds run) and a message."""


@dataclass(frozen=True, slots=True)
class Caller:
    """One tool call's client: its MCP session (``None`` on a stateless revision), what it accepts, its trace."""

    revision: str
    session: object | None = None
    """The connection's session, which keys a default workspace; ``None``: a stateless request (2026-07-28)."""
    tasks: bool = False
    """The request declared the Tasks extension: a long call may answer with a task instead of its result."""
    progress: Progress | None = None
    """The request carried a progress token."""
    trace: Mapping[str, str] = field(default_factory=dict)
    """The W3C trace context the client sent (``traceparent``, ``tracestate``)."""

    @property
    def stateless(self) -> bool:
        return self.session is None


class App(Protocol):
    """What an SDK binding serves: tools listed and called as wire dicts, and the Tasks extension's methods."""

    name: str
    version: str
    instructions: str

    def list_tools(self, caller: Caller) -> list[dict[str, Any]]: ...

    async def call_tool(self, name: str, arguments: Mapping[str, Any] | None, caller: Caller) -> dict[str, Any]: ...

    def get_task(self, task_id: str) -> dict[str, Any]: ...

    def cancel_task(self, task_id: str) -> None: ...
