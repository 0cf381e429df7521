"""A span per request (``execspace serve`` with traces on, docs/operations.md "Traces"): its method, route, status,
the sandbox it concerns and that sandbox's template; the W3C trace context the request carries (``traceparent``,
``tracestate``: the E2B SDK's ``headers=``) is its parent, and what the request causes (a workspace created, a
program run) is its child.

The route is the path's template (``/sandboxes/{sandboxID}``, ``/contexts/{contextID}``): a path's own parts, its
query (a signed file URL's signature, a file's path) and the request's headers and body stay out of the span."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..tracing import AttributeValue, Span, Tracer
from .routing import target_of
from .sandboxes import Sandboxes, SandboxGone

__all__ = ["TRACE_HEADERS", "SandboxAttributes", "TracedRequests", "held_sandbox", "route_of", "sandbox_id_only"]

#: What a request's span says of the sandbox it names (by its id).
SandboxAttributes = Callable[[str], dict[str, AttributeValue]]

#: The W3C trace context headers: an incoming request's parent, and what a server that passes requests on replaces.
TRACE_HEADERS = ("traceparent", "tracestate")
_CREATES = frozenset({"/sandboxes", "/v2/sandboxes"})
#: Bytes of a create's answer read for the new sandbox's id and template.
_CREATE_ANSWER = 64 * 1024
#: Control-plane paths naming a sandbox or a template (snapshot), and the static parts that are no id.
_CONTROL_IDS = re.compile(r"/(?:v2/)?(sandboxes|templates)/([^/]+)")
_NOT_IDS = frozenset({"metrics", "tags"})
_CONTROL_ROUTE = re.compile(r"(/(?:v2/)?(sandboxes|templates)/)([^/]+)(/[a-z]+)?")
_CONTROL_STATIC = frozenset({"/templates/tags", "/sandboxes/metrics", "/execspace/pool"})
_CONTEXT = re.compile(r"/contexts/[^/]+(/restart)?")
_RPC_PATH = re.compile(r"/[A-Za-z_][\w.]*\.[A-Za-z_]\w*/[A-Za-z_]\w*")
_PLAIN = frozenset(
    {"/", "/health", "/files", "/execute", "/contexts", "/sandboxes", "/v2/sandboxes", "/snapshots", "/metrics"}
)


def route_of(path: str, *, data_plane: bool) -> str:
    """The low-cardinality template of ``path`` (OpenTelemetry's ``http.route``): ids replaced by their names,
    any other path one ``/{path}`` (a client's made-up paths are not each a route of their own)."""
    if data_plane:
        if context := _CONTEXT.fullmatch(path):
            return "/contexts/{contextID}" + (context[1] or "")
        return path if path in _PLAIN or _RPC_PATH.fullmatch(path) else "/{path}"
    found = _CONTROL_ROUTE.fullmatch(path)
    if found is not None and found[3] not in _NOT_IDS:
        return f"{found[1]}{{{'sandboxID' if found[2] == 'sandboxes' else 'templateID'}}}{found[4] or ''}"
    return path if path in _PLAIN or path in _CONTROL_STATIC else "/{path}"


def sandbox_id_only(sandbox_id: str) -> dict[str, AttributeValue]:
    """What a server that does not hold the sandbox says of it (the front door of ``serve --ray``): its id."""
    return {"execspace.sandbox.id": sandbox_id}


def held_sandbox(sandboxes: Sandboxes) -> SandboxAttributes:
    """What serve says of a sandbox it holds: its id and template."""

    def described(sandbox_id: str) -> dict[str, AttributeValue]:
        found = sandbox_id_only(sandbox_id)
        # an unknown or ended sandbox (answered 404 or 502): its id is all there is
        with contextlib.suppress(SandboxGone):
            found["execspace.template"] = sandboxes.get(sandbox_id).template
        return found

    return described


class TracedRequests:
    """Wraps a server's application: each HTTP request in a span; the request passes through unchanged."""

    def __init__(self, app: ASGIApp, tracer: Tracer, domain: str | None, sandbox: SandboxAttributes) -> None:
        """``domain``: the server's (``--domain``), whose hosts name sandboxes; ``sandbox``: what the span of a
        request naming a sandbox says of it."""
        self._app = app
        self._tracer = tracer
        self._domain = domain
        self._sandbox = sandbox

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path: str = scope["path"]
        method: str = scope["method"]
        target = target_of(headers, self._domain)
        data_plane = target is not None or (path == "/files" and b"signature=" in scope.get("query_string", b""))
        route = route_of(path, data_plane=data_plane)
        attributes: dict[str, AttributeValue] = {"http.request.method": method, "http.route": route}
        sandbox = target.sandbox_id if target is not None else self._control_sandbox(path)
        if sandbox is not None:
            attributes.update(self._sandbox(sandbox))
        parent = {name: value for name in TRACE_HEADERS if (value := headers.get(name)) is not None}
        created = _Created() if method == "POST" and path in _CREATES else None
        with self._tracer.span(f"{method} {route}", attributes, parent=parent, kind="server") as span:

            async def sent(message: Message) -> None:
                _saw(span, message, created)
                await send(message)

            await self._app(scope, receive, sent)
            if created is not None:
                created.record(span)

    @staticmethod
    def _control_sandbox(path: str) -> str | None:
        found = _CONTROL_IDS.match(path)
        return found[2] if found is not None and found[1] == "sandboxes" and found[2] not in _NOT_IDS else None


def _saw(span: Span, message: Message, created: _Created | None) -> None:
    if message["type"] == "http.response.start":
        status = int(message["status"])
        span.set("http.response.status_code", status)
        if status >= 500:  # a server span's error, by OpenTelemetry's HTTP conventions (4xx are the client's)
            span.failed(str(status))
        if created is not None:
            created.status = status
    elif message["type"] == "http.response.body" and created is not None:
        created.take(bytes(message.get("body", b"")))


class _Created:
    """A create's answer, for the new sandbox's id and template."""

    def __init__(self) -> None:
        self.status = 0
        self._answer = b""

    def take(self, body: bytes) -> None:
        if len(self._answer) < _CREATE_ANSWER:
            self._answer += body[: _CREATE_ANSWER - len(self._answer)]

    def record(self, span: Span) -> None:
        if self.status != 201 or not self._answer:
            return
        try:
            answer = json.loads(self._answer)
        except ValueError:
            return
        if not isinstance(answer, dict):
            return
        for key, attribute in (("sandboxID", "execspace.sandbox.id"), ("templateID", "execspace.template")):
            if isinstance(value := answer.get(key), str):
                span.set(attribute, value)
