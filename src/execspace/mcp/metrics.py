"""The Prometheus metrics of ``execspace mcp --transport http`` (docs/operations.md "Metrics"): tool calls by tool
and outcome, their latency, and the live workspaces (read at each scrape), in a ``CollectorRegistry`` of this
server's own."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sized

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .observe import ToolCall

__all__ = ["McpMetrics"]

#: Seconds a tool call took: from a file read (milliseconds) to a long command (its max_timeout).
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)


class McpMetrics:
    """Call it with each tool call (:data:`.observe.CallListener`)."""

    def __init__(self, workspaces: Callable[[], Sized]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._calls = Counter(
            "execspace_mcp_tool_calls", "Tool calls, by tool and outcome", ["tool", "outcome"], registry=self.registry
        )
        self._duration = Histogram(
            "execspace_mcp_tool_call_duration_seconds",
            "Seconds a tool call took, by tool",
            ["tool"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_Workspaces(workspaces))

    def expect(self, tools: list[str]) -> None:
        """Start each tool's series at 0 (a rate over its first call is then right)."""
        for tool in tools:
            for outcome in ("ok", "error"):
                self._calls.labels(tool, outcome)

    def __call__(self, call: ToolCall) -> None:
        self._calls.labels(call.tool, call.outcome).inc()
        self._duration.labels(call.tool).observe(call.duration)


class _Workspaces(Collector):
    def __init__(self, workspaces: Callable[[], Sized]) -> None:
        self._workspaces = workspaces

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("execspace_mcp_workspaces", "Workspaces open", value=len(self._workspaces()))
