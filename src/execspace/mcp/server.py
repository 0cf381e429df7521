"""Serving the tools over MCP: stdio, or streamable HTTP behind a bearer token.

The order of set-up is what makes a failure leave nothing behind: the configuration is checked, then the HTTP
socket is bound (a port in use fails before any backend starts), then the engine opens; from there every exit
path removes the server's workspaces and closes the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import uvicorn

from ..artifacts import ArtifactService, FileArtifactService, InMemoryArtifactService
from ..audit import AuditLog, key_id, reopened_on_hangup
from ..engine import open_engine_from
from ..errors import InvalidSpec
from ..listening import listen
from ..scrape import MetricsAccess, MetricsEndpoint, prometheus_missing
from ..tracing import NO_TRACER, Tracer, from_environment
from .app import McpApp
from .config import McpConfig
from .observe import CallListener, McpAudit
from .sdk import Bound, bind
from .tasks import Tasks
from .toolset import McpTools
from .workspaces import Workspaces

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .metrics import McpMetrics

__all__ = ["MCP_PATH", "BearerAuth", "generate_token", "serve"]

#: Where the streamable HTTP endpoint is served.
MCP_PATH = "/mcp"

Transport = Literal["stdio", "http"]
_LOOPBACK = ("127.0.0.1", "::1", "localhost")
Asgi = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


def generate_token() -> str:
    return secrets.token_urlsafe(32)


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
                counted.expect(tools.names())
            tasks = Tasks(after=config.task_after, ttl=config.task_ttl)
            reaper = asyncio.create_task(workspaces.reap_forever(config.reap_interval))
            try:
                bound = bind(McpApp(tools, tasks, tracer))
                with reopened_on_hangup(audit):
                    if sock is None:
                        await bound.serve_stdio()
                    else:
                        assert token is not None  # checked above
                        scrape = _Scrape(counted.registry if counted is not None else None, metrics)
                        await _serve_http(bound, sock, host, token, config.max_file_bytes, on_ready, scrape)
            finally:
                reaper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reaper
                await tasks.aclose()  # their runs stop before their workspaces go
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
        fix = "pip install 'execspace[mcp]', or run with --metrics off"
        raise prometheus_missing(exc, "mcp", fix, "execspace mcp") from None
    return McpMetrics(workspaces.listing)


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


async def _serve_http(
    bound: Bound,
    sock: socket.socket,
    host: str,
    token: str,
    max_file_bytes: int,
    on_ready: Callable[[str, int], None] | None,
    scrape: _Scrape,
) -> None:
    # a write_file of max_file_bytes arrives base64-encoded (4/3) inside a JSON-RPC message
    manager = bound.http_manager(loopback=host in _LOOPBACK, max_body=max_file_bytes * 4 // 3 + 64 * 1024)
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
