"""``GET /metrics`` of ``execspace serve`` and ``execspace mcp --transport http`` (docs/operations.md "Metrics"):
the Prometheus text of one server's own ``CollectorRegistry``, answered in front of the server's application; and,
where a server knows of others to scrape (the front door of ``serve --ray``: its nodes' servers), ``GET
/metrics/targets``, their list in Prometheus's HTTP service discovery format.

Who may scrape is the server's ``--metrics``: ``open`` (anyone who reaches the port: a scraper holds no E2B key),
``key`` (the server's API key in ``X-API-KEY``, or ``Authorization: Bearer``; an MCP server's bearer token), ``off``
(404, and no metric is kept). ``prometheus_client`` is imported when the first scrape is answered, never by a
server whose metrics are off.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any, Literal, get_args

from .errors import InvalidSpec, SetupFailed

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = [
    "METRICS_PATH",
    "TARGETS_PATH",
    "MetricsAccess",
    "MetricsEndpoint",
    "TargetGroup",
    "check_access",
    "holds_key",
    "prometheus_missing",
]

#: Who may scrape: anyone, a holder of the server's key or token, or nobody (no metrics kept).
MetricsAccess = Literal["open", "key", "off"]
METRICS_PATH = "/metrics"
TARGETS_PATH = "/metrics/targets"
#: One group of Prometheus's HTTP service discovery: ``{"targets": ["host:port"], "labels": {"name": "value"}}``.
TargetGroup = dict[str, list[str] | dict[str, str]]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
#: An ASGI application (typed loosely: starlette's and the MCP SDK's spell their scopes differently).
App = Callable[[Any, Any, Any], Awaitable[None]]


def prometheus_missing(exc: ImportError, stage: str, fix: str, component: str) -> SetupFailed:
    """The error of a server whose metrics are on where ``prometheus_client`` cannot be imported."""
    return SetupFailed(stage, f"metrics need prometheus_client ({exc.name} is missing)", fix, component=component)


def check_access(value: str) -> MetricsAccess:
    """``value`` as a :data:`MetricsAccess`, or ``InvalidSpec`` naming the choices."""
    for access in get_args(MetricsAccess):
        if value == access:
            return access  # type: ignore[no-any-return]  # one of the Literal's own strings
    raise InvalidSpec(f"metrics must be one of {', '.join(get_args(MetricsAccess))}, got {value!r}")


def holds_key(headers: Iterable[tuple[bytes, bytes]], keys: Iterable[str]) -> bool:
    """Whether a request carries one of ``keys`` in ``X-API-KEY`` or as ``Authorization: Bearer`` (every key
    compared, in constant time)."""
    given = [v for k, v in headers if k.lower() == b"x-api-key"]
    given += [v[7:] for k, v in headers if k.lower() == b"authorization" and v[:7].lower() == b"bearer "]
    return any([hmac.compare_digest(g, key.encode()) for g in given for key in keys])


class MetricsEndpoint:
    """Answers ``GET /metrics`` of the requests ``mine(scope)`` says are the server's own (serve: not a sandbox's);
    passes every other request to ``app`` unchanged."""

    def __init__(
        self,
        app: App,
        registry: CollectorRegistry | None,
        access: MetricsAccess,
        keys: Callable[[], Iterable[str]],
        mine: Callable[[Scope], bool] = lambda scope: True,
        targets: Callable[[], list[TargetGroup]] | None = None,
    ) -> None:
        """``registry``: None when ``access`` is ``off``; ``keys``: what ``key`` access takes; ``targets``: the
        other servers to scrape, answered at :data:`TARGETS_PATH` under the same rule (None: that path is the
        application's)."""
        self._app = app
        self._registry = registry
        self._access = access
        self._keys = keys
        self._mine = mine
        self._targets = targets
        self._paths = (METRICS_PATH,) if targets is None else (METRICS_PATH, TARGETS_PATH)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self._paths or not self._mine(scope):
            await self._app(scope, receive, send)
            return
        if scope["method"] != "GET":
            await _answer(send, 405, f"read it with GET {scope['path']}\n".encode(), [(b"allow", b"GET")])
        elif self._registry is None or self._access == "off":
            await _answer(send, 404, b"metrics are off on this server (its --metrics open or key turns them on)\n")
        elif self._access == "key" and not holds_key(scope.get("headers") or (), self._keys()):
            message = b"this server's metrics need its key: X-API-KEY or Authorization: Bearer (--metrics key)\n"
            await _answer(send, 401, message, [(b"www-authenticate", b"Bearer")])
        elif scope["path"] == TARGETS_PATH and self._targets is not None:
            body = json.dumps(self._targets()).encode()
            await _answer(send, 200, body, content_type=b"application/json")
        else:
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            await _answer(send, 200, generate_latest(self._registry), content_type=CONTENT_TYPE_LATEST.encode())


async def _answer(
    send: Send,
    status: int,
    body: bytes,
    extra: list[tuple[bytes, bytes]] | None = None,
    content_type: bytes = b"text/plain; charset=utf-8",
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
