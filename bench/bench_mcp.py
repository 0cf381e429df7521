"""`execspace mcp` benchmarks (9): what a tool call costs over MCP, against the same tool called in process.

A server subprocess (``execspace mcp``, the ``sandbox`` backend) is driven by the official MCP SDK's client, over
streamable HTTP (one kept session) and over stdio. The baseline is the same ``workspace_exec`` tool, on a
``sandbox`` engine opened in this process, called directly with the same arguments: the difference is what the
protocol, the transport and the server's dispatch add to a ``true`` command, whose own run both sides pay.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import execspace
from bench_core import Plan, Report, Row, Stats, backend_ready, interleaved, scratch_dir
from execspace.testing.binding import make_traversable
from execspace.testing.processes import read_until, terminate

SECTION = "10 mcp"
TOKEN = "bench-" + "0123456789abcdef" * 2
ARGS = {"command": "true", "workspace_id": "bench/mcp"}


@contextlib.contextmanager
def _http_server(root: Any) -> Iterator[str]:
    argv = [sys.executable, "-m", "execspace", "mcp", "--transport", "http", "--port", "0", "--backend", "sandbox"]
    env = {**os.environ, "EXECSPACE_DAEMON": "off", "PYTHONUNBUFFERED": "1", "EXECSPACE_MCP_TOKEN": TOKEN}
    env["TMPDIR"] = str(root)
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    try:
        assert proc.stderr is not None
        found, _ = read_until(proc.stderr, rb"streamable HTTP on (http://\S+)", 60)
        if found is None:
            raise RuntimeError("execspace mcp did not start")
        yield found.group(1).decode()
    finally:
        terminate(proc)


@contextlib.asynccontextmanager
async def _sessions(url: str, root: Any) -> AsyncIterator[tuple[Any, Any]]:
    import httpx
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client

    env = {**os.environ, "EXECSPACE_DAEMON": "off", "TMPDIR": str(root)}
    stdio = StdioServerParameters(
        command=sys.executable, args=["-m", "execspace", "mcp", "--backend", "sandbox"], env=env
    )
    async with (
        httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as client,
        streamable_http_client(url, http_client=client) as (hr, hw, _),
        ClientSession(hr, hw) as over_http,
        stdio_client(stdio) as (sr, sw),
        ClientSession(sr, sw) as over_stdio,
    ):
        await over_http.initialize()
        await over_stdio.initialize()
        yield over_http, over_stdio


def _row(name: str, lib: list[float], base: list[float], target_ms: float) -> Row:
    row = Row(SECTION, name, "ms", Stats.of(lib, 1000), Stats.of(base, 1000), "the tool called in process")
    assert row.delta is not None
    row.target, row.passed = f"median Δ ≤ {target_ms:g} ms", row.delta <= target_ms
    return row


async def run_mcp(plan: Plan, report: Report, log: Any) -> None:
    if not await backend_ready("sandbox", "10 mcp benchmarks", report, log):
        return
    try:
        import mcp  # noqa: F401
    except ImportError:
        report.notes.append("mcp: the SDK is not installed (pip install 'execspace[dev]'): skipped")
        return
    from execspace.tools import WorkspaceExecTool

    log("10 mcp")
    with scratch_dir("execspace-bench-mcp-") as root:
        make_traversable(root)
        with _http_server(root) as url:
            async with (
                _sessions(url, root) as (over_http, over_stdio),
                execspace.open_engine("sandbox", workspace_root=root / "direct") as engine,
                WorkspaceExecTool(engine, workspace_id="bench/mcp") as direct,
            ):

                async def via_http() -> None:
                    _check((await over_http.call_tool("workspace_exec", ARGS)).isError, "over HTTP")

                async def via_stdio() -> None:
                    _check((await over_stdio.call_tool("workspace_exec", ARGS)).isError, "over stdio")

                async def in_process() -> None:
                    _check((await direct.call({"command": "true"})).get("exit_code") != 0, "in process")

                iters, warmup = plan.serve_iters, plan.warmup // 3
                http_t, stdio_t, base = await interleaved([via_http, via_stdio, in_process], iters, warmup)
        report.rows.append(_row("workspace_exec 'true' over MCP streamable HTTP", http_t, base, 10))
        report.rows.append(_row("workspace_exec 'true' over MCP stdio", stdio_t, base, 5))


def _check(failed: bool, how: str) -> None:
    # a benchmark of a failing call measures the wrong thing: stop loudly
    if failed:
        raise RuntimeError(f"workspace_exec failed {how}")
