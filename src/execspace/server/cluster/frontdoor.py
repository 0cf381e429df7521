"""The front door: E2B's API on one port, every sandbox operation sent to the node agent that holds the sandbox.

See docs/cluster.md. The control plane is answered by the nodes' own servers (the caller's ``X-API-KEY`` passed on:
teams stay theirs to enforce), each of which reports its Ray node id as ``clientID``; data-plane traffic is proxied
as it streams (:mod:`.proxy`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hmac
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
from connectrpc.code import Code
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router
from starlette.types import ASGIApp, Receive, Scope, Send

from ...audit import AuditLog
from ...backend import BackendOptions
from ...errors import SetupFailed
from ...listening import listen
from ...scrape import TargetGroup, prometheus_missing
from ...tracing import NO_TRACER, Tracer
from ..bodies import CONTROL_BODY_BYTES
from ..connections import raise_descriptor_limit
from ..control import error_response
from ..options import TLS, ServerOptions, key_id
from ..routing import target_of
from ..serve import audited_and_traced, serve_app, with_metrics_endpoint
from ..tracing import TracedRequests, sandbox_id_only
from .doorevents import (
    CLUSTER_FULL,
    RPC_PREFIXES,
    CreateAnswered,
    DoorAudit,
    DoorListener,
    FrontDoorEvents,
    NodeCalled,
    NodeLost,
    Unavailable,
    UnavailableCause,
    create_outcome,
)
from .nodeclient import NodeAnswer, NodeClient
from .nodeconfig import AgentConfig, Endpoint
from .nodes import Nodes, connect
from .proxy import ClientGone, proxy

if TYPE_CHECKING:
    from .doormetrics import DoorMetrics

__all__ = ["FrontDoor", "serve_cluster"]

_log = logging.getLogger("execspace.server.cluster")

_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
_CREATE_PATHS = ("/sandboxes", "/v2/sandboxes")
#: Seconds a node's server has to accept a connection before the request is answered 503.
_CONNECT_TIMEOUT = 5.0
#: Seconds a control-plane call may take on a node (a create may wait for its template's environment to build).
_CONTROL_TIMEOUT = 900.0
#: A v2 list's page when the query names no limit (the single-host server's).
_LIST_LIMIT = 100


class FrontDoor:
    """The front door's ASGI callable over the cluster's nodes."""

    def __init__(
        self,
        nodes: Nodes,
        options: ServerOptions,
        client: httpx.AsyncClient,
        control: NodeClient,
        events: FrontDoorEvents | None = None,
        tracer: Tracer = NO_TRACER,
    ) -> None:
        """``events``: who is told what the front door decides (its metrics, its audit log); ``tracer``: whose
        current span (the request's, :class:`..tracing.TracedRequests`) each request to a node carries as its
        ``traceparent``."""
        self._nodes = nodes
        self._tracer = tracer
        self._traced = tracer.enabled
        self._options = options
        self._client = client
        self._control_client = control
        self._events = events or FrontDoorEvents()
        nodes.when_gone(self._node_gone)
        self._keys = [k.encode() for k in (*options.api_keys, *options.admin_keys)]
        guard = self._authenticated
        self._guarded_create = guard(self._create)
        self._control = Router(
            routes=[
                Route("/health", self._health, methods=["GET"]),
                Route("/sandboxes", guard(self._list), methods=["GET"]),
                Route("/v2/sandboxes", guard(self._list), methods=["GET"]),
                Route("/snapshots", guard(self._list_snapshots), methods=["GET"]),
                Route("/sandboxes/metrics", guard(self._anywhere), methods=_ALL_METHODS),
                Route("/sandboxes/{object_id}", guard(self._on_node), methods=_ALL_METHODS),
                Route("/sandboxes/{object_id}/{rest:path}", guard(self._on_node), methods=_ALL_METHODS),
                Route("/v2/sandboxes/{object_id}/{rest:path}", guard(self._on_node), methods=_ALL_METHODS),
                Route("/templates/{object_id}", guard(self._on_node), methods=["DELETE"]),
                Route("/{path:path}", guard(self._anywhere), methods=_ALL_METHODS),
            ]
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = Headers(scope=scope)
        target = target_of(headers, self._options.domain)
        if target is None and scope["path"] == "/files" and b"signature=" in scope.get("query_string", b""):
            message = (
                "a signed file URL names no sandbox the front door can route: serve the cluster with --domain "
                "(host-based routing), or send the E2b-Sandbox-Id header"
            )
            await error_response(400, message)(scope, receive, send)
            return
        if target is None:
            if scope["method"] == "POST" and scope["path"] in _CREATE_PATHS:  # the hot call skips the router
                await (await self._guarded_create(Request(scope, receive)))(scope, receive, send)
            else:
                await self._control(scope, receive, send)
            return
        try:
            node_id = await self._nodes.locate(target.sandbox_id)
        except SetupFailed as exc:
            await self._unavailable("setup", str(exc))(scope, receive, send)
            return
        if node_id is None:
            await _not_found(scope, receive, send, target.sandbox_id)
            return
        extra = [(b"e2b-sandbox-id", target.sandbox_id.encode()), (b"e2b-sandbox-port", str(target.port).encode())]
        if headers.get("e2b-sandbox-id"):
            extra = []  # the client's own headers are passed on
        if self._traced:  # the node's span of it is the front door's child, not the client's
            extra += [(k.encode(), v.encode()) for k, v in self._tracer.headers().items()]
        try:
            endpoint = await self._nodes.agent(node_id)
            await proxy(self._client, endpoint.url, scope, receive, send, extra, self._nodes.cut(node_id))
        except ClientGone:
            pass
        except SetupFailed as exc:
            await self._unavailable("setup", str(exc))(scope, receive, send)
        except httpx.TransportError as exc:
            if await self._gone(node_id, exc):
                await _not_found(scope, receive, send, target.sandbox_id)
            else:
                message = f"the node of sandbox {target.sandbox_id} does not answer now ({exc!r}): retry"
                await self._unavailable("node", message)(scope, receive, send)

    def _unavailable(self, cause: UnavailableCause, message: str) -> Response:
        """A 503 with ``Retry-After``, told to the listeners."""
        if self._events.listening:
            self._events(Unavailable(cause))
        return error_response(503, message, {"Retry-After": "1"})

    def _node_gone(self, node_id: str, endpoint: Endpoint | None) -> None:
        if endpoint is not None:
            self._control_client.drop(endpoint.url)  # its calls in flight end with it
        if self._events.listening:
            self._events(NodeLost(node_id))

    # --- the control plane ------------------------------------------------------------------------------------

    def _authenticated(
        self, handler: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def checked(request: Request) -> Response:
            given = request.headers.get("x-api-key", "").encode()
            if not any([hmac.compare_digest(given, k) for k in self._keys]):
                return error_response(401, "Invalid API key: send one the server was started with (--api-key)")
            try:
                return await handler(request)
            except httpx.TransportError as exc:
                return self._unavailable("node", f"a node of the cluster does not answer now ({exc!r}): retry")
            except SetupFailed as exc:
                return self._unavailable("setup", str(exc))

        return checked

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _create(self, request: Request) -> Response:
        """A create placed on a node (:meth:`_place`), its outcome told to the listeners."""
        if not self._events.listening:
            return await self._place(request)
        who = key_id(request.headers.get("x-api-key", ""))
        try:
            response = await self._place(request)
        except (SetupFailed, httpx.TransportError):
            self._events(CreateAnswered("error", who))
            raise
        self._events(CreateAnswered(create_outcome(response.status_code), who))
        return response

    async def _place(self, request: Request) -> Response:
        body = await _body(request)
        if isinstance(body, Response):
            return body
        try:
            template = json.loads(body or b"{}").get("templateID")
        except (ValueError, AttributeError):
            template = None  # the node's server answers the malformed body
        only = None
        if isinstance(template, str) and template not in self._options.templates:  # a snapshot: on its node
            only = await self._nodes.locate(template)
        tried: list[str] = []
        failed: SetupFailed | None = None
        while (node_id := self._nodes.choose(tried, only)) is not None:
            tried.append(node_id)
            try:
                answer = await self._call(node_id, request, body)
            except SetupFailed as exc:  # that node's agent cannot serve: the next node may
                _log.error("%s", exc)
                failed = exc
                continue
            except httpx.TransportError as exc:
                await self._gone(node_id, exc)
                continue
            if answer.status_code == 429:
                self._nodes.full(node_id)
                continue
            if answer.status_code == 201 and isinstance(sandbox_id := answer.json().get("sandboxID"), str):
                self._nodes.add(node_id, sandbox_id)
            else:  # nothing made there (a 503 while its template's environment builds): its retry finds it again
                self._nodes.release(node_id)
                _log_refusal(node_id, answer)
            return _answer(answer)
        if failed is not None:
            return self._unavailable("setup", str(failed))
        if only is None:  # more nodes help a create that may go anywhere (Ray's autoscaler, where one runs)
            self._nodes.waiting()
        return error_response(429, CLUSTER_FULL, {"Retry-After": "1"})

    async def _list(self, request: Request) -> Response:
        """Every living node's list, merged in the order asked; a v2 page ends where the first ``limit`` end, its
        ``nextToken`` the single-host server's cursor, which every node reads the same way."""
        found: list[dict[str, Any]] = []
        more = False
        for _, answer in await self._every_node(request):
            if answer.status_code != 200:
                return _answer(answer)  # a query the nodes refuse (400), as one host answers it
            more = more or "x-next-token" in answer.headers
            found += answer.json()
        found.sort(key=_started, reverse=request.query_params.get("order", "desc") == "desc")
        headers = {}
        limit = int(request.query_params.get("limit") or _LIST_LIMIT)  # the nodes checked it
        if request.url.path.startswith("/v2/") and (more or len(found) > limit):
            found = found[:limit]
            headers["x-next-token"] = _cursor(found[-1])
        return JSONResponse(found, headers=headers)

    async def _list_snapshots(self, request: Request) -> Response:
        found: list[Any] = []
        headers: dict[str, str] = {}
        for _, answer in await self._every_node(request):
            if answer.status_code != 200:
                return _answer(answer)
            # a snapshot store a machine's nodes share lists the same snapshot on each of them: once is enough
            found += [s for s in answer.json() if s not in found]
            headers.update((k, v) for k, v in answer.headers.items() if k.startswith("x-execspace"))
        return JSONResponse(found, headers=headers)

    async def _every_node(self, request: Request) -> list[tuple[str, NodeAnswer]]:
        """The answers of every living node to a bodiless request; a node found gone is left out (its sandboxes
        are no more), one that does not answer now fails the whole (503): a list short of its sandboxes would
        say they are gone."""
        nodes = self._nodes.alive()
        answers = await asyncio.gather(*(self._call(n, request, b"") for n in nodes), return_exceptions=True)
        found = []
        for node_id, answer in zip(nodes, answers, strict=True):
            if isinstance(answer, httpx.TransportError) and await self._gone(node_id, answer):
                continue
            if isinstance(answer, BaseException):
                raise answer
            found.append((node_id, answer))
        return found

    async def _on_node(self, request: Request) -> Response:
        """A call on one sandbox (or snapshot), answered by its node's server."""
        object_id = request.path_params["object_id"]
        node_id = await self._nodes.locate(object_id)
        if node_id is None:
            return error_response(404, f"sandbox {object_id!r} not found")
        body = await _body(request)
        if isinstance(body, Response):
            return body
        try:
            answer = await self._call(node_id, request, body)
        except httpx.TransportError as exc:
            if await self._gone(node_id, exc):
                return error_response(404, f"sandbox {object_id!r} not found")
            raise
        self._follow(request, object_id, node_id, answer)
        return _answer(answer)

    def _follow(self, request: Request, object_id: str, node_id: str, answer: NodeAnswer) -> None:
        """Keep the map as a node's answer changed it: a kill, a fork, a snapshot."""
        path = request.url.path
        if request.method == "DELETE" and answer.status_code in (204, 404):
            self._nodes.forget(object_id)
        elif request.method == "POST" and answer.status_code in (200, 201) and path.endswith(("/fork", "/snapshots")):
            made = answer.json()
            if isinstance(made, dict) and isinstance(made.get("sandboxID"), str):
                self._nodes.add(node_id, made["sandboxID"])
            if isinstance(made, dict) and isinstance(made.get("snapshotID"), str):
                # by its id and its names: a create names either (a name two teams share on two nodes leads to the
                # later one's node, where the other team's create answers its template not found)
                for key in [made["snapshotID"], *(n for n in made.get("names") or [] if isinstance(n, str))]:
                    self._nodes.add(node_id, key, snapshot=True)

    async def _anywhere(self, request: Request) -> Response:
        """A route that names no sandbox: any living node answers it as it answers on one host."""
        nodes = self._nodes.alive()
        if not nodes:
            return self._unavailable("no_node", "no node of the cluster is alive: retry once Ray reports one")
        body = await _body(request)
        if isinstance(body, Response):
            return body
        return _answer(await self._call(nodes[0], request, body))

    async def _gone(self, node_id: str, error: httpx.TransportError) -> bool:
        """Whether a node whose connection failed is gone: its server refuses a new connection (nothing serves its
        sandboxes any more). A node that does not answer in time is not known gone."""
        if not isinstance(error, httpx.ConnectError):
            try:
                endpoint = await self._nodes.agent(node_id)
                async with httpx.AsyncClient(timeout=_CONNECT_TIMEOUT) as fresh:
                    await fresh.get(endpoint.url + "/health")
                return False
            except httpx.ConnectError as refused:
                error = refused
            except httpx.TransportError:
                return False
        self._nodes.lost(node_id, f"its server refuses connections: {error}")
        return True

    async def _call(self, node_id: str, request: Request, body: bytes) -> NodeAnswer:
        endpoint = await self._nodes.agent(node_id)
        headers = [(k, v) for k, v in request.headers.items() if k in ("x-api-key", "content-type", "user-agent")]
        if self._traced:
            headers += self._tracer.headers().items()
        # the target as the client sent it (its path percent-encoded still): what the node's server parses alike
        target = (request.scope.get("raw_path") or request.scope["path"].encode()).decode("latin-1")
        if query := request.scope.get("query_string"):
            target += "?" + query.decode("latin-1")
        started = time.perf_counter()
        try:
            return await self._control_client.request(
                request.method, endpoint.url + target, content=body, headers=headers
            )
        finally:
            if self._events.listening:
                self._events(NodeCalled(time.perf_counter() - started))


async def _body(request: Request) -> bytes | Response:
    """A control-plane body, read up to the bound the single-host server keeps."""
    data = b""
    async for chunk in request.stream():
        data += chunk
        if len(data) > CONTROL_BODY_BYTES:
            return error_response(413, f"the request body is larger than {CONTROL_BODY_BYTES} bytes")
    return data


def _log_refusal(node_id: str, answer: NodeAnswer) -> None:
    """A node's server's failure to create, in this front door's log: Ray forwards the nodes' own logs (an
    environment's build, step by step) only to the front door whose agent started them, so every other one says
    here what its creates were answered (the build's step, or its failure and its log on the node)."""
    if answer.status_code < 500:
        return
    try:
        message = answer.json().get("message", "")
    except (ValueError, AttributeError):
        message = answer.content[:500].decode(errors="replace")
    _log.warning("a create on node %s: %d %s", node_id, answer.status_code, message)


def _answer(answer: NodeAnswer) -> Response:
    """A node's answer, as the front door's (its server reports its Ray node id as ``clientID`` itself)."""
    headers = {
        k: v for k, v in answer.headers.items() if k in ("retry-after", "x-next-token") or k.startswith("x-execspace")
    }
    kind = answer.headers.get("content-type") or None
    return Response(answer.content, status_code=answer.status_code, headers=headers, media_type=kind)


def _started(sandbox: dict[str, Any]) -> tuple[datetime, str]:
    """The order of the single-host server's lists: started, then id."""
    started = datetime.fromisoformat(str(sandbox.get("startedAt", "")).replace("Z", "+00:00"))
    return started, str(sandbox.get("sandboxID", ""))


def _cursor(sandbox: dict[str, Any]) -> str:
    """The single-host server's ``nextToken`` of a listed sandbox: every node's server reads it the same way."""
    started = str(sandbox.get("startedAt", "")).replace("Z", "+00:00")
    return base64.urlsafe_b64encode(f"{started}|{sandbox.get('sandboxID', '')}".encode()).decode()


async def _not_found(scope: Scope, receive: Receive, send: Send, sandbox_id: str) -> None:
    """What a data-plane request of a sandbox no node holds gets: the single-host server's 502 "... not found"."""
    message = f"The sandbox {sandbox_id} was not found; it was killed, it expired, its node is gone or it never existed"
    response: Response
    if scope["path"].startswith(RPC_PREFIXES):
        response = JSONResponse({"code": Code.UNAVAILABLE.value, "message": message}, status_code=502)
    else:
        response = error_response(502, message)
    await response(scope, receive, send)


async def serve_cluster(
    options: ServerOptions,
    address: str,
    *,
    host: str = "127.0.0.1",
    port: int = 3000,
    backend: str = "sandbox",
    backend_options: BackendOptions | None = None,
    on_ready: Callable[[str, int], None] | None = None,
    tls: TLS | None = None,
    slots: int | None = None,
) -> None:
    """Serve a front door of the Ray cluster at ``address`` until cancelled or signalled (docs/cluster.md). The
    sandboxes outlive it: they are the nodes' (a front door that restarts finds them again). A node holds the
    sandboxes its ``execspace_sandbox`` resource says, else ``slots`` (default ``options.max_sandboxes``; 0: none).
    With ``options.audit_log`` each node's server appends to that path on its machine, and the front door to it on
    its own (docs/operations.md "Audit log")."""
    with listen(host, port, "execspace serve") as sock:
        default = options.max_sandboxes if slots is None else slots
        config = AgentConfig(options, backend, backend_options, default)
        # the front door's own tracer, of its OTEL_* variables (each node's server has its own, of its node's)
        async with audited_and_traced(options.audit_log) as (audit, tracer):
            await _serve_door(sock, config, address, on_ready, tls, audit, tracer or NO_TRACER)


async def _serve_door(
    sock: socket.socket,
    config: AgentConfig,
    address: str,
    on_ready: Callable[[str, int], None] | None,
    tls: TLS | None,
    audit: AuditLog | None,
    tracer: Tracer,
) -> None:
    options = config.options
    descriptors = raise_descriptor_limit()  # each proxied stream holds two connections
    await asyncio.to_thread(connect, address)
    nodes = Nodes(config)
    await nodes.open()
    metrics = _door_metrics(options, nodes)
    listeners: list[DoorListener] = [] if metrics is None else [metrics]
    if audit is not None:
        listeners.append(DoorAudit(audit))
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    control = NodeClient(_CONNECT_TIMEOUT, _CONTROL_TIMEOUT)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(None, connect=_CONNECT_TIMEOUT)) as client:
        watch = asyncio.create_task(nodes.watch())
        warm = asyncio.create_task(_start_agents(nodes))
        try:
            app: ASGIApp = FrontDoor(nodes, options, client, control, FrontDoorEvents(listeners), tracer)
            if metrics is not None:
                app = metrics.counting(app, options.domain)
            registry = None if metrics is None else metrics.registry
            app = with_metrics_endpoint(app, options, registry, functools.partial(_targets, nodes))
            if tracer.enabled:
                app = TracedRequests(app, tracer, options.domain, sandbox_id_only)
            await serve_app(app, sock, options, on_ready, _nothing, tls, descriptors)
        finally:
            await control.aclose()
            for task in (watch, warm):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


def _door_metrics(options: ServerOptions, nodes: Nodes) -> DoorMetrics | None:
    """The front door's metrics, unless they are off (then prometheus_client is not imported)."""
    if options.metrics == "off":
        return None
    try:
        from .doormetrics import DoorMetrics
    except ImportError as exc:
        fix = "pip install 'execspace[serve]', or serve with --metrics off"
        raise prometheus_missing(exc, "serve", fix, "execspace serve --ray") from None
    return DoorMetrics(nodes)


def _targets(nodes: Nodes) -> list[TargetGroup]:
    """Prometheus's HTTP service discovery of the living nodes' servers, each labelled with its Ray node id."""
    return [
        {"targets": [urlsplit(e.url).netloc], "labels": {"execspace_node": e.node_id}}
        for e in sorted(nodes.endpoints(), key=lambda e: e.node_id)
    ]


async def _start_agents(nodes: Nodes) -> None:
    """Start (or find) every living node's agent now, so that the first creates do not wait for them."""
    for node_id, result in zip(
        alive := nodes.alive(),
        await asyncio.gather(*(nodes.agent(n) for n in alive), return_exceptions=True),
        strict=True,
    ):
        if isinstance(result, BaseException):
            _log.error("the agent of node %s did not start: %s", node_id, result)


async def _nothing() -> None:
    """What a front door ends before its connections close: nothing, its sandboxes are the nodes' and live on."""
