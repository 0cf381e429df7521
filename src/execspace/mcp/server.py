"""Serving the tools over MCP: stdio, or streamable HTTP behind a bearer token.

The order of set-up is what makes a failure leave nothing behind: the configuration is checked, then the HTTP
socket is bound (a port in use fails before any backend starts), then the engine opens; from there every exit
path removes the server's workspaces and closes the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
import socket
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import uvicorn
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from .. import __version__
from ..artifacts import ArtifactService, FileArtifactService, InMemoryArtifactService
from ..audit import AuditLog, key_id
from ..engine import open_engine_from
from ..errors import InvalidSpec, SetupFailed
from ..listening import listen
from ..scrape import MetricsAccess, MetricsEndpoint
from ..tracing import NO_TRACER, Tracer, from_environment
from .config import McpConfig
from .observe import CallListener, McpAudit
from .toolset import McpTools
from .tracing import tool_attributes, trace_context
from .workspaces import Workspaces

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .metrics import McpMetrics

__all__ = ["MCP_PATH", "BearerAuth", "build_server", "generate_token", "serve"]

#: Where the streamable HTTP endpoint is served.
MCP_PATH = "/mcp"

Transport = Literal["stdio", "http"]
Asgi = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]

_INSTRUCTIONS = (
    "execspace runs your commands and code in isolated workspaces. Each result names its workspace_id: pass it "
    "back to keep working on the same files (sessions may be reset between calls). Commands run in work/, and the "
    "file tools take paths relative to it (inputs/ holds inputs); results go to ../out/ ($OUTPUT_DIR), and images "
    "your code writes there come back as images."
)


def generate_token() -> str:
    return secrets.token_urlsafe(32)


def build_server(tools: McpTools, tracer: Tracer = NO_TRACER) -> Server[Any, Any]:
    """The MCP server of ``tools``: one workspace default per MCP session; each tool call a span of ``tracer``
    whose parent is the trace context the client sent (:mod:`.tracing`)."""
    server: Server[Any, Any] = Server("execspace", version=__version__, instructions=_INSTRUCTIONS)

    async def list_tools() -> list[types.Tool]:
        return tools.list()

    async def call_tool(name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
        # our own argument checks name the field and the fix; the SDK's jsonschema pass would answer first
        context = server.request_context
        if not tracer.enabled:
            return await tools.call(name, arguments, context.session)
        parent = trace_context(context.meta, context.request)
        with tracer.span(f"tools/call {name}", tool_attributes(name), parent=parent, kind="server") as span:
            result = await tools.call(name, arguments, context.session)
            span.set("execspace.tool.is_error", bool(result.isError))
            return result

    server.list_tools()(list_tools)  # type: ignore[no-untyped-call]  # the SDK leaves its decorators untyped
    server.call_tool(validate_input=False)(call_tool)
    return server


class BearerAuth:
    """An ASGI wrapper answering 401 to any HTTP request without ``Authorization: Bearer <token>``."""

    def __init__(self, app: Asgi, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(
        self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or ()).get(b"authorization", b"")
            if not secrets.compare_digest(given, self._expected):
                await _respond(send, 401, b"missing or wrong bearer token\n", [(b"www-authenticate", b"Bearer")])
                return
            if scope["path"].rstrip("/") != MCP_PATH:
                await _respond(send, 404, f"the MCP endpoint is {MCP_PATH}\n".encode(), [])
                return
        await self.app(scope, receive, send)


async def _respond(send: Callable[[Any], Awaitable[None]], status: int, body: bytes, extra: list[Any]) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def serve(
    config: McpConfig,
    *,
    transport: Transport = "stdio",
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    on_ready: Callable[[str, int], None] | None = None,
    metrics: MetricsAccess = "open",
    audit_log: Path | None = None,
) -> None:
    """Serve until the client leaves (stdio) or until cancelled (http); then remove every workspace.

    ``metrics``: who may read ``GET /metrics`` over HTTP (:mod:`execspace.scrape`; ``key``: the bearer token);
    ``audit_log``: a file getting one JSON line per tool call (:mod:`.observe`), reopened on SIGHUP.

    Raises:
        InvalidSpec: ``http`` without a token.
        SetupFailed: the port cannot be bound, or the backend cannot start (nothing is left running).
    """
    if transport == "http" and not token:
        raise InvalidSpec("the http transport needs a bearer token (generate_token() makes one)")
    keywords = _backend_keywords(config)
    # the server's one tracer (the config's, or the OTEL_* variables'): its tool calls' spans and its engine's
    own_tracer = from_environment("execspace-mcp") if keywords.get("tracer") is None else None
    if own_tracer is not None:
        keywords["tracer"] = own_tracer
    tracer = cast("Tracer", keywords.get("tracer") or NO_TRACER)
    sock: socket.socket | None = None
    audit: AuditLog | None = None
    try:
        sock = listen(host, port, "execspace mcp") if transport == "http" else None
        audit = AuditLog(audit_log) if audit_log is not None else None
        async with open_engine_from(config.backend, keywords) as engine:
            workspaces = Workspaces(engine, idle_timeout=config.idle_timeout, max_workspaces=config.max_workspaces)
            counted = _metrics(workspaces) if transport == "http" and metrics != "off" else None
            listeners: list[CallListener] = [counted] if counted is not None else []
            if audit is not None:
                listeners.append(McpAudit(audit))
            caller = key_id(token) if transport == "http" and token else None
            tools = McpTools(engine, config, workspaces, _artifacts(config), listeners, caller)
            if counted is not None:
                counted.expect([t.name for t in tools.list()])
            reaper = asyncio.create_task(workspaces.reap_forever(config.reap_interval))
            try:
                server = build_server(tools, tracer)
                with _reopened_on_hangup(audit):
                    if sock is None:
                        await _serve_stdio(server)
                    else:
                        assert token is not None  # checked above
                        scrape = _Scrape(counted.registry if counted is not None else None, metrics)
                        await _serve_http(server, sock, host, token, config.max_file_bytes, on_ready, scrape)
            finally:
                reaper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reaper
                await tools.aclose()
                await workspaces.aclose()
    finally:
        if sock is not None:
            sock.close()
        if audit is not None:
            audit.close()
        if own_tracer is not None:
            await asyncio.to_thread(own_tracer.close)


def _metrics(workspaces: Workspaces) -> McpMetrics:
    try:
        from .metrics import McpMetrics
    except ImportError as exc:
        raise SetupFailed(
            "mcp",
            f"metrics need prometheus_client ({exc.name} is missing)",
            "pip install 'execspace[mcp]', or run with --metrics off",
            component="execspace mcp",
        ) from None
    return McpMetrics(workspaces.listing)


@contextlib.contextmanager
def _reopened_on_hangup(audit: AuditLog | None) -> Iterator[None]:
    """SIGHUP reopens the audit log (a rotation renamed it) while the block runs."""
    if audit is None:
        yield
        return
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGHUP, audit.reopen)
    except (RuntimeError, ValueError):  # not the main thread: the owner reopens it (AuditLog.reopen)
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGHUP)


@dataclass(frozen=True, slots=True)
class _Scrape:
    """``GET /metrics`` of the HTTP transport: the registry (None: metrics off) and who may read it."""

    registry: CollectorRegistry | None
    access: MetricsAccess


def _backend_keywords(config: McpConfig) -> dict[str, object]:
    keywords = dict(config.backend_options)
    roots = [str(r) for r in (*config.upload_roots, *config.skill_roots)]
    if roots:  # skills are copied in, uploads read, only from these
        keywords["host_roots"] = roots
    if config.policy.network is not None:
        keywords["network"] = config.policy.network
    return keywords


def _artifacts(config: McpConfig) -> ArtifactService:
    if config.artifacts_dir is None:
        return InMemoryArtifactService()
    return FileArtifactService(config.artifacts_dir)


async def _serve_stdio(server: Server[Any, Any]) -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def _serve_http(
    server: Server[Any, Any],
    sock: socket.socket,
    host: str,
    token: str,
    max_file_bytes: int,
    on_ready: Callable[[str, int], None] | None,
    scrape: _Scrape,
) -> None:
    manager = StreamableHTTPSessionManager(
        app=server,
        security_settings=_security(host),
        # a write_file of max_file_bytes arrives base64-encoded (4/3) inside a JSON-RPC message
        max_request_body_size=max_file_bytes * 4 // 3 + 64 * 1024,
    )
    app = MetricsEndpoint(BearerAuth(manager.handle_request, token), scrape.registry, scrape.access, lambda: (token,))
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
    async with manager.run():
        await _Uvicorn(config, on_ready).serve(sockets=[sock])


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, telling where it listens once it does."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[str, int], None] | None) -> None:
        super().__init__(config)
        self._on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self._on_ready is not None and sockets:
            host, port = sockets[0].getsockname()[:2]
            self._on_ready(host, port)


def _security(host: str) -> TransportSecuritySettings:
    """On a loopback address, Host and Origin must name it (a web page's DNS rebinding); elsewhere the token is
    the only gate, as the names the server is reached by are not known here."""
    loopback = ("127.0.0.1", "localhost", "[::1]")
    if host not in ("127.0.0.1", "::1", "localhost"):
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{h}:*" for h in loopback] + list(loopback),
        allowed_origins=[f"http://{h}:*" for h in loopback],
    )
