"""``execspace mcp`` with the OTEL_* variables: each tool call is a span whose parent is the trace context the
client sent in the request's ``_meta`` (stdio) or its HTTP headers (streamable HTTP), and the runs it causes are its
children; the tool's arguments (the command) stay out of every span. Driven by the installed SDK's client: under
mcp 1.x a 2025 revision (a session), under mcp 2.x the stateless 2026-07-28 revision (a workspace handle)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp", reason="the MCP server is tested with the official SDK (pip install 'execspace[dev]')")

from mcp import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from execspace.testing.processes import read_until, terminate
from tests.mcpserver.conftest import MCP_MAJOR, STATELESS, TOKEN, write_config
from tests.tracing.receiver import ReceivedSpan, Receiver, otlp_receiver

if MCP_MAJOR >= 2:
    import httpx2
    from mcp import Client
else:
    import httpx
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

COMMAND = "echo mcp-traced-7d2e; exit 6"


def _env(receiver: Receiver) -> dict[str, str]:
    return {**os.environ, "EXECSPACE_DAEMON": "off", "PYTHONUNBUFFERED": "1", **receiver.env()}


def _check(spans: list[ReceivedSpan], trace_id: str, parent_id: str) -> None:
    call = next(s for s in spans if s.name == "tools/call workspace_exec")
    assert (call.trace_id, call.parent_span_id, call.kind) == (trace_id, parent_id, 2)
    assert call.attributes["gen_ai.tool.name"] == "workspace_exec"
    assert call.attributes["mcp.method.name"] == "tools/call"
    run = next(s for s in spans if s.name == "execspace.run" and s.parent_span_id == call.span_id)
    assert run.attributes["execspace.run.exit_code"] == 6 and run.attributes["execspace.backend"] == "sandbox"
    assert all("mcp-traced-7d2e" not in str(v) for s in spans for v in s.attributes.values())


async def test_an_mcp_tool_call_is_a_span_under_the_trace_of_its_meta(tmp_path: Path) -> None:
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    with otlp_receiver() as receiver:
        config = write_config(tmp_path)
        argv = ["-m", "execspace", "mcp", "--config", str(config)]
        params = StdioServerParameters(command=sys.executable, args=argv, env=_env(receiver))
        async with _over_stdio(params) as client:
            meta = {"traceparent": f"00-{trace_id}-{parent_id}-01"}
            result = await _exec(client, meta)
            assert "mcp-traced-7d2e" in str(result.content)
        # the client closed the server's stdin: it exits, exporting what its tracer holds
        receiver.wait_for(lambda r: bool(r.named("tools/call workspace_exec") and r.named("execspace.run")))
        _check(list(receiver.spans), trace_id, parent_id)


async def test_an_mcp_tool_call_over_http_takes_the_trace_context_of_its_headers(tmp_path: Path) -> None:
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    with otlp_receiver() as receiver:
        config = write_config(tmp_path)
        argv = [sys.executable, "-m", "execspace", "mcp", "--transport", "http", "--port", "0", "--config", str(config)]
        env = {**_env(receiver), "EXECSPACE_MCP_TOKEN": TOKEN}
        process = subprocess.Popen(argv, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
        try:
            assert process.stderr is not None
            found, seen = read_until(process.stderr, rb"streamable HTTP on (http://\S+)", 60)
            assert found is not None, seen.decode(errors="replace")
            headers = {"Authorization": f"Bearer {TOKEN}", "traceparent": f"00-{trace_id}-{parent_id}-01"}
            async with _over_http(found.group(1).decode(), headers) as client:
                await _exec(client)
        finally:
            terminate(process)
            assert process.stderr is not None
            process.stderr.close()
        receiver.wait_for(lambda r: bool(r.named("tools/call workspace_exec") and r.named("execspace.run")))
        _check(list(receiver.spans), trace_id, parent_id)


async def _exec(client: Any, meta: dict[str, Any] | None = None) -> Any:
    """``COMMAND`` by workspace_exec in a workspace workspace_create made (the handle 2026-07-28 needs)."""
    created = await client.call_tool("workspace_create", {})
    handle = json.loads(created.content[0].text)["workspace_id"]
    return await client.call_tool("workspace_exec", {"command": COMMAND, "workspace_id": handle}, meta=meta)


@contextlib.asynccontextmanager
async def _over_stdio(params: StdioServerParameters) -> AsyncIterator[Any]:
    """The installed SDK's client of the server ``params`` start (2.x's on 2026-07-28, 1.x's on a 2025 revision)."""
    if MCP_MAJOR >= 2:
        async with Client(params, mode=STATELESS) as client:
            assert client.protocol_version == STATELESS
            yield client
    else:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session


@contextlib.asynccontextmanager
async def _over_http(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """The installed SDK's streamable HTTP client of ``url``, sending ``headers`` with every request."""
    if MCP_MAJOR >= 2:
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http,
            Client(streamable_http_client(url, http_client=http), mode=STATELESS) as client,
        ):
            assert client.protocol_version == STATELESS
            yield client
    else:
        async with (
            httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=120)) as http,
            streamable_http_client(url, http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session
