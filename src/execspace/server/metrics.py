"""The Prometheus metrics of ``execspace serve`` (docs/operations.md "Metrics"): a listener of the server's events
(:mod:`.events`) counting into a ``CollectorRegistry`` of this server's own, gauges read from the sandbox table,
the pools and the code interpreter when a scrape asks, and the requests counted by route as they are answered.

Labels are low-cardinality by construction: templates (the server's configured ones), outcomes, languages, route
templates (:func:`.tracing.route_of`; a path the server does not serve is ``/{path}``), status codes. No sandbox id,
key or path is a label.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .events import (
    CellExecuted,
    CommandEnded,
    CommandStarted,
    EgressAttempted,
    FileChanged,
    Outcome,
    Refused,
    SandboxChanged,
    ServerEvent,
)
from .routing import target_of
from .sandboxes import Sandboxes
from .tracing import route_of

__all__ = ["COMMAND_BUCKETS", "CountedRequests", "ServerMetrics"]

#: Seconds a command ran: from a ``true`` (milliseconds) to a build (minutes).
COMMAND_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


class ServerMetrics:
    """One server's metrics: call it with each event (:class:`.events.Events` listener)."""

    def __init__(self, sandboxes: Sandboxes, live_kernels: Callable[[], dict[str, int]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self._created = Counter(
            "execspace_sandboxes_created", "Sandboxes created (forks too)", ["template"], registry=r
        )
        self._killed = Counter("execspace_sandboxes_killed", "Sandboxes killed by a request", ["template"], registry=r)
        self._expired = Counter(
            "execspace_sandboxes_expired", "Sandboxes ended by their timeout", ["template"], registry=r
        )
        self._commands = Counter(
            "execspace_commands",
            "Commands ended, by outcome (ok, error exit, signal, limit or timeout)",
            ["outcome"],
            registry=r,
        )
        self._started = Counter("execspace_commands_started", "Commands started", registry=r)
        self._duration = Histogram(
            "execspace_command_duration_seconds",
            "Seconds from a command's start to its end",
            buckets=COMMAND_BUCKETS,
            registry=r,
        )
        self._egress = Counter(
            "execspace_egress_connections",
            "Connections asked of the egress proxies, by verdict",
            ["verdict"],
            registry=r,
        )
        self._cells = Counter("execspace_cell_executions", "Cells given to code contexts", ["language"], registry=r)
        self._files = Counter(
            "execspace_file_operations", "File API writes, removes and renames", ["operation"], registry=r
        )
        self._written = Counter("execspace_file_written_bytes", "Bytes written by the file API", registry=r)
        self._refused = Counter(
            "execspace_refusals", "Requests refused by policy: capacity (429), network (403)", ["reason"], registry=r
        )
        self.requests = Counter(
            "execspace_http_requests",
            "HTTP requests answered, by route template and status",
            ["route", "code"],
            registry=r,
        )
        r.register(_LiveCollector(sandboxes, live_kernels or dict))
        # every series a server can have from the start at 0, so that a rate over the first event is right
        for template in sandboxes.options.templates:
            for counter in (self._created, self._killed, self._expired):
                counter.labels(template)
        for outcome in get_args(Outcome):
            self._commands.labels(outcome)
        for verdict in ("allowed", "denied"):
            self._egress.labels(verdict)
        for reason in ("capacity", "network"):
            self._refused.labels(reason)

    def counting(self, app: ASGIApp, domain: str | None, served: frozenset[str]) -> ASGIApp:
        """``app`` with its requests counted (:class:`CountedRequests`)."""
        return CountedRequests(app, self.requests, domain, served)

    def __call__(self, event: ServerEvent) -> None:
        match event:
            case CommandEnded():
                self._commands.labels(event.outcome).inc()
                self._duration.observe(event.duration)
            case CommandStarted():
                self._started.inc()
            case EgressAttempted():
                self._egress.labels("allowed" if event.allowed else "denied").inc()
            case FileChanged():
                self._files.labels(event.kind).inc()
                if event.size is not None:
                    self._written.inc(event.size)
            case SandboxChanged(kind="create"):
                self._created.labels(event.template).inc()
            case SandboxChanged(kind="kill"):
                self._killed.labels(event.template).inc()
            case SandboxChanged(kind="expire"):
                self._expired.labels(event.template).inc()
            case CellExecuted():
                self._cells.labels(event.language).inc()
            case Refused():
                self._refused.labels(event.what).inc()


class _LiveCollector(Collector):
    """What is there now, read at each scrape: sandboxes by template and state, the pools, the live kernels."""

    def __init__(self, sandboxes: Sandboxes, live_kernels: Callable[[], dict[str, int]]) -> None:
        self._sandboxes = sandboxes
        self._live_kernels = live_kernels

    def collect(self) -> Iterator[GaugeMetricFamily]:
        live = GaugeMetricFamily(
            "execspace_sandboxes", "Live sandboxes by template and state", labels=["template", "state"]
        )
        counts = {(t, s): 0 for t in self._sandboxes.options.templates for s in ("running", "paused")}
        for sandbox in self._sandboxes:
            key = (sandbox.template, sandbox.state)
            counts[key] = counts.get(key, 0) + 1
        for (template, state), count in sorted(counts.items()):
            live.add_metric([template, state], count)
        yield live
        ready = GaugeMetricFamily("execspace_pool_ready", "Pooled sandboxes ready to be taken", labels=["template"])
        target = GaugeMetricFamily(
            "execspace_pool_target", "Pooled sandboxes kept, within the room", labels=["template"]
        )
        for template, status in sorted(self._sandboxes.pool.status().items()):
            ready.add_metric([template], status["ready"])
            target.add_metric([template], status["target"])
        yield ready
        yield target
        kernels = GaugeMetricFamily(
            "execspace_kernels", "Code contexts with a kernel started, by language", labels=["language"]
        )
        for language, count in sorted(self._live_kernels().items()):
            kernels.add_metric([language], count)
        yield kernels


class CountedRequests:
    """Wraps the server's application: each HTTP request counted by its route template and status when its answer
    starts (a stream's when its head is sent)."""

    def __init__(self, app: ASGIApp, requests: Counter, domain: str | None, served: frozenset[str]) -> None:
        """``served``: the data plane's own paths; any other a client sends counts as ``/{path}``."""
        self._app = app
        self._requests = requests
        self._domain = domain
        self._served = served

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        path: str = scope["path"]
        data_plane = target_of(Headers(scope=scope), self._domain) is not None
        route = route_of(path, data_plane=data_plane)
        if data_plane and route == path and path not in self._served:
            route = "/{path}"
        counted = False

        async def sent(message: Message) -> None:
            nonlocal counted
            if message["type"] == "http.response.start" and not counted:
                counted = True
                self._requests.labels(route, str(message["status"])).inc()
            await send(message)

        await self._app(scope, receive, sent)
