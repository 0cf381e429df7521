"""The server under mcp 2.x, driven by the official 2.x client: the stateless 2026-07-28 revision (workspace
handles as arguments, Tasks for long calls, progress, structured and image content) and a 2025 revision forced
with ``mode="legacy"``, over stdio and streamable HTTP, on the sandbox backend."""

from __future__ import annotations

import base64
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from execspace.testing.processes import new_tag, tagged, wait_no_process

from .conftest import MCP_MAJOR, PNG_SIGNATURE, STATELESS, TOKEN, running_http_server, server_env, write_config

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        MCP_MAJOR < 2, reason="needs the mcp 2.x client (./run test runs tests/mcpserver in a venv of mcp 2.x)"
    ),
]

if MCP_MAJOR >= 2:
    import httpx2
    from mcp import Client, StdioServerParameters, types
    from mcp.client.streamable_http import streamable_http_client

    from .tasksclient import TasksClient

#: A 1x1 PNG written by the sandboxed program itself (no plotting library needed in the sandbox).
PNG_CODE = (
    "import struct, zlib, os\n"
    "def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))\n"
    "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 1, 8, 2, 0, 0, 0))"
    " + chunk(b'IDAT', zlib.compress(b'\\x00\\xff\\x00\\x00')) + chunk(b'IEND', b'')\n"
    "open(os.environ['OUTPUT_DIR'] + '/figure.png', 'wb').write(png)\n"
)


def data(res: types.CallToolResult) -> dict[str, Any]:
    first = res.content[0]
    assert isinstance(first, types.TextContent)
    parsed: dict[str, Any] = json.loads(first.text)
    assert res.structured_content == parsed
    return parsed


@contextlib.asynccontextmanager
async def stdio_client(config: Path, mode: str, **options: Any) -> AsyncIterator[Client]:
    argv = ["-m", "execspace", "mcp", "--backend", "sandbox", "--config", str(config)]
    params = StdioServerParameters(command=sys.executable, args=argv, env=server_env())
    async with Client(params, mode=mode, **options) as client:
        yield client


@contextlib.asynccontextmanager
async def http_client(url: str, mode: str, **options: Any) -> AsyncIterator[Client]:
    """A client of its own connection: on 2026-07-28 no session ties one to another."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode, **options) as client,
    ):
        yield client


async def test_stateless_stdio_needs_the_handle_workspace_create_minted(tmp_path: Path) -> None:
    async with stdio_client(write_config(tmp_path), STATELESS) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        without = data(await client.call_tool("workspace_exec", {"command": "true"}))
        unknown = data(await client.call_tool("workspace_exec", {"command": "true", "workspace_id": "mcp-nope"}))
        created = data(await client.call_tool("workspace_create", {}))
        handle = created["workspace_id"]
        wrote = data(
            await client.call_tool("workspace_exec", {"command": "echo 41 > n; id -u", "workspace_id": handle})
        )
        read = data(await client.call_tool("workspace_exec", {"command": "cat n", "workspace_id": handle}))
        revision = client.protocol_version
    assert revision == STATELESS
    assert "workspace_id" in tools["workspace_exec"].input_schema["required"]
    assert tools["workspace_exec"].output_schema is not None and tools["workspace_close"].output_schema is None
    assert (without["error_type"], unknown["error_type"]) == ("InvalidSpec", "WorkspaceNotFound")
    assert "workspace_create" in without["error"] and "workspace_create" in unknown["error"]
    assert created["created"] is True and handle.startswith("mcp-")
    assert wrote.get("exit_code") == 0 and wrote["stdout"].strip() != "0", wrote  # the sandbox's uid, not root
    assert (read.get("stdout"), read["workspace_id"]) == ("41\n", handle), read


async def test_a_2025_revision_forced_on_the_2x_client_keeps_the_sessions_default_workspace(tmp_path: Path) -> None:
    async with stdio_client(write_config(tmp_path), "legacy") as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        first = data(await client.call_tool("workspace_exec", {"command": "echo kept > f"}))
        second = data(await client.call_tool("workspace_exec", {"command": "cat f"}))
        revision = client.protocol_version
    assert revision != STATELESS and revision.startswith("2025-")
    assert tools["workspace_exec"].input_schema["required"] == ["command"]
    assert second.get("stdout") == "kept\n" and first["workspace_id"] == second["workspace_id"], second


async def test_a_figure_comes_back_as_image_content(tmp_path: Path) -> None:
    async with stdio_client(write_config(tmp_path), STATELESS) as client:
        handle = data(await client.call_tool("workspace_create", {}))["workspace_id"]
        code = {"language": "python", "code": PNG_CODE, "workspace_id": handle}
        res = await client.call_tool("run_code", code)
    images = [c for c in res.content if isinstance(c, types.ImageContent)]
    assert data(res)["status"] == "ok", data(res)
    assert len(images) == 1 and images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data).startswith(PNG_SIGNATURE)


def test_a_handle_is_reused_by_independent_stateless_http_clients_and_a_2025_one(tmp_path: Path) -> None:
    payload = bytes(range(256)) * 4

    async def scenario(url: str) -> None:
        async with http_client(url, STATELESS) as first:
            handle = data(await first.call_tool("workspace_create", {}))["workspace_id"]
            await first.call_tool(
                "write_file",
                {
                    "workspace_id": handle,
                    "path": "b.bin",
                    "content": base64.b64encode(payload).decode(),
                    "encoding": "base64",
                },
            )
        async with http_client(url, STATELESS) as second:
            read = data(
                await second.call_tool("read_file", {"workspace_id": handle, "path": "b.bin", "encoding": "base64"})
            )
            revision = second.protocol_version
        async with http_client(url, "legacy") as legacy:
            listed = data(await legacy.call_tool("list_files", {"workspace_id": handle}))
        assert revision == STATELESS
        assert base64.b64decode(read["content_base64"]) == payload and read["workspace_id"] == handle
        assert {"path": "b.bin", "kind": "file", "size": len(payload)} in listed["entries"]

    with running_http_server(tmp_path, "--backend", "sandbox") as server:
        anyio_run(scenario, server.url)


def test_a_long_run_becomes_a_task_and_a_waiting_call_gets_progress(tmp_path: Path) -> None:
    async def scenario(url: str) -> None:
        tasks = TasksClient()
        async with http_client(url, STATELESS, extensions=[tasks]) as client:
            handle = data(await client.call_tool("workspace_create", {}))["workspace_id"]
            quick = data(await client.call_tool("workspace_exec", {"command": "echo quick", "workspace_id": handle}))
            created_by_quick = len(tasks.created)
            long = await client.call_tool("workspace_exec", {"command": "sleep 3; echo done", "workspace_id": handle})
        progress: list[tuple[float, str | None]] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append((value, message))

        async with http_client(url, STATELESS) as plain:  # no Tasks extension: it waits, and hears progress
            waited = await plain.call_tool(
                "workspace_exec",
                {"command": "sleep 2.5; echo waited", "workspace_id": handle},
                progress_callback=on_progress,
            )
        assert quick["stdout"] == "quick\n" and created_by_quick == 0  # a short call is answered inline
        assert len(tasks.created) == 1 and tasks.created[0].status == "working"
        assert any(p.status == "working" and "running for" in (p.status_message or "") for p in tasks.polls)
        assert tasks.polls[-1].status == "completed"
        assert (data(long)["exit_code"], data(long)["stdout"]) == (0, "done\n")
        assert data(waited)["stdout"] == "waited\n"
        assert progress and all(m is not None and m.startswith("running for") for _, m in progress)
        assert [v for v, _ in progress] == sorted(v for v, _ in progress)

    with running_http_server(tmp_path, "--backend", "sandbox", extra_config="task_after = 1") as server:
        anyio_run(scenario, server.url)


def test_a_cancelled_task_stops_its_run(tmp_path: Path) -> None:
    tag = new_tag("mcp-task")

    async def scenario(url: str) -> None:
        tasks = TasksClient(cancel_after_polls=1)
        async with http_client(url, STATELESS, extensions=[tasks]) as client:
            handle = data(await client.call_tool("workspace_create", {}))["workspace_id"]
            args = {"command": "sleep 60", "workspace_id": handle, "env": tagged(tag)}
            res = await client.call_tool("workspace_exec", args)
        assert tasks.polls and tasks.polls[-1].status == "cancelled" and res.is_error, (res, tasks)

    with running_http_server(tmp_path, "--backend", "sandbox", extra_config="task_after = 1") as server:
        anyio_run(scenario, server.url)
        assert wait_no_process(tag) == []


def anyio_run(scenario: Any, url: str) -> None:
    import anyio

    anyio.run(scenario, url)
