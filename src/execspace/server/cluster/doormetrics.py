"""The Prometheus metrics of a front door of ``serve --ray`` (docs/operations.md "Metrics: the cluster"): a listener
of the front door's events (:mod:`.doorevents`) counting into a ``CollectorRegistry`` of this front door's own, the
nodes' states and loads read from its :class:`.nodes.Nodes` when a scrape asks, and the requests it passes on
counted by kind, status class and bytes as they go.

Each node's server keeps its own metrics (sandboxes, commands, files) at its own ``/metrics``, which the front
door lists at ``/metrics/targets`` for Prometheus to find. Labels stay few: kinds, classes, outcomes, and the
nodes' ids (one series a node).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .doorevents import (
    CreateAnswered,
    CreateOutcome,
    DoorEvent,
    NodeCalled,
    NodeLost,
    Unavailable,
    UnavailableCause,
    route_kind,
)
from .nodes import Nodes

__all__ = ["CALL_BUCKETS", "DoorMetrics"]

#: Seconds a control-plane call of a node took: a kill or a list (milliseconds) to a create that waits for a build.
CALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0, 900.0)


class DoorMetrics:
    """One front door's metrics: call it with each event (a :class:`.doorevents.FrontDoorEvents` listener)."""

    def __init__(self, nodes: Nodes) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self._creates = Counter(
            "execspace_frontdoor_creates", "Creates answered by the front door, by outcome", ["outcome"], registry=r
        )
        self._losses = Counter("execspace_frontdoor_node_losses", "Nodes found gone, with their sandboxes", registry=r)
        self._unavailable = Counter(
            "execspace_frontdoor_unavailable",
            "Requests answered 503 (Retry-After) by the front door, by cause",
            ["cause"],
            registry=r,
        )
        self._calls = Histogram(
            "execspace_frontdoor_node_call_duration_seconds",
            "Seconds a control-plane call of a node's server took",
            buckets=CALL_BUCKETS,
            registry=r,
        )
        self._requests = Counter(
            "execspace_frontdoor_requests",
            "Requests answered through the front door, by kind and status class",
            ["kind", "code"],
            registry=r,
        )
        self._bytes = Counter(
            "execspace_frontdoor_body_bytes",
            "Body bytes through the front door: up (from clients), down (to clients)",
            ["direction"],
            registry=r,
        )
        r.register(_NodesCollector(nodes))
        # every series of a fixed label from the start at 0, so that a rate over the first event is right
        for outcome in get_args(CreateOutcome):
            self._creates.labels(outcome)
        for cause in get_args(UnavailableCause):
            self._unavailable.labels(cause)
        for direction in ("up", "down"):
            self._bytes.labels(direction)

    def __call__(self, event: DoorEvent) -> None:
        match event:
            case NodeCalled():
                self._calls.observe(event.seconds)
            case CreateAnswered():
                self._creates.labels(event.outcome).inc()
            case Unavailable():
                self._unavailable.labels(event.cause).inc()
            case NodeLost():
                self._losses.inc()

    def counting(self, app: ASGIApp, domain: str | None) -> ASGIApp:
        """``app`` with its requests and their bodies' bytes counted."""

        async def counted(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            kind = route_kind(scope, domain)
            up, down = self._bytes.labels("up"), self._bytes.labels("down")

            async def received() -> Message:
                message = await receive()
                if body := message.get("body"):
                    up.inc(len(body))
                return message

            async def sent(message: Message) -> None:
                if message["type"] == "http.response.start":
                    self._requests.labels(kind, f"{message['status'] // 100}xx").inc()
                elif body := message.get("body"):
                    down.inc(len(body))
                await send(message)

            await app(scope, received, sent)

        return counted


class _NodesCollector(Collector):
    """The cluster as this front door sees it, read at each scrape: nodes by state, each living node's slots and
    the sandboxes its agent last reported."""

    def __init__(self, nodes: Nodes) -> None:
        self._nodes = nodes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        states = GaugeMetricFamily("execspace_frontdoor_nodes", "Nodes of the cluster by state", labels=["state"])
        for state, count in self._nodes.states().items():
            states.add_metric([state], count)
        yield states
        held = GaugeMetricFamily(
            "execspace_frontdoor_node_sandboxes",
            "Sandboxes each living node held at its agent's last report (each second)",
            labels=["node"],
        )
        slots = GaugeMetricFamily(
            "execspace_frontdoor_node_slots", "Sandbox slots of each living node", labels=["node"]
        )
        for node_id, (capacity, count) in sorted(self._nodes.load().items()):
            held.add_metric([node_id], count)
            slots.add_metric([node_id], capacity)
        yield held
        yield slots
