"""The MCP server's application, independent of the SDK that carries it: the tools, each call traced and run
through :class:`~.tasks.Tasks` (progress, and a Task when a long call outlasts ``task_after``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import __version__
from ..tracing import NO_TRACER, Tracer
from .calls import Caller
from .tasks import Tasks
from .toolset import McpTools
from .tracing import tool_attributes

__all__ = ["McpApp"]

_INSTRUCTIONS = (
    "execspace runs your commands and code in isolated workspaces. Each result names its workspace_id: pass it "
    "back to keep working on the same files (sessions may be reset between calls; without a session, "
    "workspace_create gives the workspace_id every call needs). Commands run in work/, and the file tools take "
    "paths relative to it (inputs/ holds inputs); results go to ../out/ ($OUTPUT_DIR), and images your code "
    "writes there come back as images."
)


class McpApp:
    """What both SDK bindings serve (:class:`~.calls.App`): ``tools`` called through ``tasks``, each call a span
    of ``tracer`` whose parent is the trace context the client sent."""

    name = "execspace"
    version = __version__
    instructions = _INSTRUCTIONS

    def __init__(self, tools: McpTools, tasks: Tasks, tracer: Tracer = NO_TRACER) -> None:
        self.tools = tools
        self.tasks = tasks
        self.tracer = tracer

    def list_tools(self, caller: Caller) -> list[dict[str, Any]]:
        return self.tools.list(caller)

    async def call_tool(self, name: str, arguments: Mapping[str, Any] | None, caller: Caller) -> dict[str, Any]:
        return await self.tasks.run(self._traced(name, arguments, caller), caller)

    async def _traced(self, name: str, arguments: Mapping[str, Any] | None, caller: Caller) -> dict[str, Any]:
        if not self.tracer.enabled:
            return await self.tools.call(name, arguments, caller)
        attributes = tool_attributes(name)
        with self.tracer.span(f"tools/call {name}", attributes, parent=dict(caller.trace), kind="server") as span:
            result = await self.tools.call(name, arguments, caller)
            span.set("execspace.tool.is_error", bool(result.get("isError")))
            return result

    def get_task(self, task_id: str) -> dict[str, Any]:
        return self.tasks.get(task_id)

    def cancel_task(self, task_id: str) -> None:
        self.tasks.cancel(task_id)
