"""An :class:`~.calls.App` on ``mcp`` 1.x's low-level server: the 2025 revisions, a session per connection."""

from __future__ import annotations

from typing import Any

from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from .calls import App, Caller, Progress
from .tracing import trace_context
from .transport import security_settings

__all__ = ["Binding"]


class Binding:
    """``app`` as a 1.x ``Server``; tools/call goes straight to it (its own argument checks name the field and
    the fix, which the SDK's jsonschema pass would answer before)."""

    def __init__(self, app: App) -> None:
        self.server: Server[Any, Any] = Server(app.name, version=app.version, instructions=app.instructions)
        server = self.server

        async def list_tools() -> list[types.Tool]:
            caller = _caller(server)
            return [types.Tool.model_validate(tool) for tool in app.list_tools(caller)]

        async def call_tool(name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
            result = await app.call_tool(name, arguments, _caller(server))
            return types.CallToolResult.model_validate(result)

        server.list_tools()(list_tools)  # type: ignore[no-untyped-call]  # the SDK leaves its decorators untyped
        server.call_tool(validate_input=False)(call_tool)

    async def serve_stdio(self) -> None:
        async with stdio_server() as (read, write):
            await self.server.run(read, write, self.server.create_initialization_options())

    def http_manager(self, *, loopback: bool, max_body: int) -> StreamableHTTPSessionManager:
        return StreamableHTTPSessionManager(
            app=self.server, security_settings=security_settings(loopback), max_request_body_size=max_body
        )


def _caller(server: Server[Any, Any]) -> Caller:
    context = server.request_context
    params = context.session.client_params
    meta = context.meta
    extra = (meta.model_extra or {}) if meta is not None else {}
    return Caller(
        revision=str(params.protocolVersion) if params is not None else "",
        session=context.session,
        progress=_progress(server) if meta is not None and meta.progressToken is not None else None,
        trace=trace_context(extra, getattr(context.request, "headers", None)),
    )


def _progress(server: Server[Any, Any]) -> Progress:
    context = server.request_context
    assert context.meta is not None and context.meta.progressToken is not None
    token = context.meta.progressToken

    async def send(progress: float, message: str) -> None:
        await context.session.send_progress_notification(
            token, progress, message=message, related_request_id=str(context.request_id)
        )

    return send
