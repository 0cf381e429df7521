"""The trace context of an MCP request: what the client put in the request's ``_meta`` (``traceparent``,
``tracestate``, as MCP's trace-context convention carries W3C trace context over any transport), else the HTTP
request's headers (streamable HTTP). It is the parent of the tool call's span."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["tool_attributes", "trace_context"]

_KEYS = ("traceparent", "tracestate")


def trace_context(meta: Mapping[str, Any], headers: Mapping[str, str] | None) -> dict[str, str]:
    """The W3C trace context of a request, from its ``_meta`` (the client's own keys), else from its HTTP
    headers; empty when it carries none (the call starts a trace)."""
    found = {key: value for key in _KEYS if isinstance(value := meta.get(key), str)}
    if found:
        return found
    if headers is None:
        return {}
    return {key: value for key in _KEYS if (value := headers.get(key)) is not None}


def tool_attributes(name: str) -> dict[str, str | bool | int | float]:
    """A tool call's span: OpenTelemetry's MCP and GenAI names for the method and the tool (never its
    arguments: code, commands and file contents stay out)."""
    return {"mcp.method.name": "tools/call", "gen_ai.tool.name": name, "gen_ai.operation.name": "execute_tool"}
