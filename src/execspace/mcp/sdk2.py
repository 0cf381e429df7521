"""An :class:`~.calls.App` on ``mcp`` 2.x's low-level server: the stateless 2026-07-28 revision (no session: each
request carries its version and capabilities in ``_meta``) beside the 2025 revisions, and the Tasks extension
(``tasks/get``, ``tasks/update``, ``tasks/cancel``; a long tools/call may answer ``resultType: "task"``)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import mcp_types as types
from mcp.server.context import HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from ..errors import TaskNotFound
from .calls import TASKS_EXTENSION, App, Caller, Progress
from .tracing import trace_context
from .transport import security_settings

__all__ = ["Binding"]

Context = ServerRequestContext[Any, Any]
T = TypeVar("T")


class TaskParams(types.RequestParams):
    """The params of ``tasks/get``, ``tasks/update`` and ``tasks/cancel`` (``inputResponses`` of an update are
    ignored: no task of this server ever waits for input)."""

    task_id: str = Field(alias="taskId")


class Binding:
    """``app`` as a 2.x ``Server``. tools/call is registered as a plain request handler: its result is either a
    ``CallToolResult`` or, for a client that declared the Tasks extension, a ``CreateTaskResult``."""

    def __init__(self, app: App) -> None:
        self.server: Server[Any] = Server(app.name, version=app.version, instructions=app.instructions)
        server = self.server
        sessions = _Sessions()

        async def list_tools(ctx: Context, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
            return types.ListToolsResult.model_validate({"tools": app.list_tools(_caller(ctx, sessions))})

        async def call_tool(ctx: Context, params: types.CallToolRequestParams) -> HandlerResult:
            result = await app.call_tool(params.name, params.arguments, _caller(ctx, sessions))
            if "resultType" in result:  # a CreateTaskResult: the extension's shape, which the SDK passes as is
                return result
            return types.CallToolResult.model_validate(result)

        async def get_task(ctx: Context, params: TaskParams) -> HandlerResult:
            return _known(lambda: app.get_task(params.task_id))

        async def update_task(ctx: Context, params: TaskParams) -> HandlerResult:
            _known(lambda: app.get_task(params.task_id))
            return {}

        async def cancel_task(ctx: Context, params: TaskParams) -> HandlerResult:
            _known(lambda: app.cancel_task(params.task_id))
            return {}

        server.add_request_handler("tools/list", types.PaginatedRequestParams, list_tools)
        server.add_request_handler("tools/call", types.CallToolRequestParams, call_tool)
        server.add_request_handler("tasks/get", TaskParams, get_task)
        server.add_request_handler("tasks/update", TaskParams, update_task)
        server.add_request_handler("tasks/cancel", TaskParams, cancel_task)
        server.extensions[TASKS_EXTENSION] = {}

    async def serve_stdio(self) -> None:
        async with stdio_server() as (read, write):
            await self.server.run(read, write, self.server.create_initialization_options())

    def http_manager(self, *, loopback: bool, max_body: int) -> StreamableHTTPSessionManager:
        return StreamableHTTPSessionManager(
            app=self.server, security_settings=security_settings(loopback), max_request_body_size=max_body
        )


def _known(call: Callable[[], T]) -> T:
    """``call()``, an unknown task id a JSON-RPC error naming what to do."""
    try:
        return call()
    except TaskNotFound as exc:
        raise MCPError(code=types.INVALID_PARAMS, message=str(exc)) from None


def _caller(ctx: Context, sessions: _Sessions) -> Caller:
    meta: Mapping[str, Any] = ctx.meta or {}
    stateless = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
    capabilities = meta.get(types.CLIENT_CAPABILITIES_META_KEY)
    extensions = capabilities.get("extensions") if isinstance(capabilities, Mapping) else None
    token = meta.get("progress_token")
    return Caller(
        revision=ctx.protocol_version,
        session=None if stateless else sessions.of(ctx),
        tasks=stateless and isinstance(extensions, Mapping) and TASKS_EXTENSION in extensions,
        progress=_progress(ctx, token) if isinstance(token, str | int) else None,
        trace=trace_context(meta, getattr(ctx.request, "headers", None)),
    )


class _Session:
    """Stands for one 2025 connection's session (a hashable, weakly referenced key of its default workspace)."""

    __slots__ = ("__weakref__",)


class _Sessions:
    """The :class:`_Session` of each 2025 connection. 2.x makes a ``ServerSession`` per request; what lasts as
    long as the connection is its ``initialize`` params, one (unhashable) object: its key lives as long as it."""

    def __init__(self) -> None:
        self._keys: dict[int, tuple[weakref.ref[object], _Session]] = {}

    def of(self, ctx: Context) -> _Session:
        params = ctx.session.client_params
        if params is None:  # no handshake to tie requests together: a default of this request's own
            return _Session()
        found = self._keys.get(id(params))
        if found is not None and found[0]() is params:
            return found[1]
        ident = id(params)
        session = _Session()
        self._keys[ident] = (weakref.ref(params, lambda _: self._keys.pop(ident, None)), session)
        return session


def _progress(ctx: Context, token: str | int) -> Progress:
    async def send(progress: float, message: str) -> None:
        related = str(ctx.request_id) if ctx.request_id is not None else None
        await ctx.session.send_progress_notification(token, progress, message=message, related_request_id=related)

    return send
