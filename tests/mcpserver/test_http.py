"""The MCP server over streamable HTTP, driven by the official SDK's client: token, workspaces by id across
sessions, background sessions, files, error results."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest
from mcp import types

from execspace.testing.processes import new_tag, tagged, wait_no_process, wait_processes

from .conftest import ONLY_MCP1, TOKEN, HttpServer, http_session

pytestmark = [pytest.mark.timeout(120), ONLY_MCP1]


def result_of(res: types.CallToolResult) -> dict[str, Any]:
    first = res.content[0]
    assert isinstance(first, types.TextContent)
    data: dict[str, Any] = json.loads(first.text)
    assert res.structuredContent == data
    return data


@pytest.mark.parametrize("header", [None, "Bearer wrong-token", f"Basic {TOKEN}", f"Bearer {TOKEN}x"])
async def test_a_missing_or_wrong_token_is_refused_with_401(http_server: HttpServer, header: str | None) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    if header is not None:
        headers["Authorization"] = header
    async with httpx.AsyncClient() as client:
        answer = await client.post(http_server.url, json=body, headers=headers)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("header", ["host", "origin"])
async def test_a_foreign_host_or_origin_is_refused_even_with_the_token(http_server: HttpServer, header: str) -> None:
    """On a loopback address a web page's DNS rebinding (a foreign Host or Origin) gets nowhere."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {TOKEN}"}
    headers[header] = "evil.example" if header == "host" else "http://evil.example"
    async with httpx.AsyncClient() as client:
        answer = await client.post(http_server.url, json=body, headers=headers)
    assert answer.status_code in (400, 403, 421)
    assert "Invalid" in answer.text


async def test_the_sdk_client_with_a_wrong_token_cannot_connect(http_server: HttpServer) -> None:
    with pytest.RaisesGroup(httpx.HTTPStatusError, flatten_subgroups=True) as caught:
        async with http_session(http_server.url, token="wrong"):
            pass
    assert caught.value.exceptions[0].response.status_code == 401  # type: ignore[union-attr]


async def test_tools_are_listed_and_a_command_runs(http_server: HttpServer) -> None:
    async with http_session(http_server.url) as session:
        names = {t.name for t in (await session.list_tools()).tools}
        res = await session.call_tool("workspace_exec", {"command": "echo out; echo err >&2; exit 7"})
    assert {"workspace_create", "workspace_list", "workspace_close", "workspace_exec", "workspace_poll"} <= names
    assert {"workspace_write_stdin", "workspace_kill", "run_code", "write_file", "read_file"} <= names
    assert {"list_files", "remove_file", "save_artifact"} <= names
    data = result_of(res)
    assert (data["exit_code"], data["stdout"], data["stderr"]) == (7, "out\n", "err\n")
    assert not res.isError
    assert data["workspace_id"].startswith("mcp-")


async def test_an_explicit_workspace_id_reaches_the_same_files_from_another_session(http_server: HttpServer) -> None:
    payload = bytes(range(256)) * 3
    async with http_session(http_server.url) as first:
        created = result_of(await first.call_tool("workspace_create", {"workspace_id": "proj/alpha"}))
        written = await first.call_tool(
            "write_file",
            {
                "workspace_id": "proj/alpha",
                "path": "blob.bin",
                "content": base64.b64encode(payload).decode(),
                "encoding": "base64",
            },
        )
    assert created == {"status": "ok", "workspace_id": "proj/alpha", "created": True}
    assert result_of(written)["size"] == len(payload)
    async with http_session(http_server.url) as second:  # a new Mcp-Session-Id, as claude.ai makes
        read = result_of(
            await second.call_tool(
                "read_file", {"workspace_id": "proj/alpha", "path": "blob.bin", "encoding": "base64"}
            )
        )
        listed = result_of(await second.call_tool("list_files", {"workspace_id": "proj/alpha"}))
        default = result_of(await second.call_tool("list_files", {}))
        workspaces = result_of(await second.call_tool("workspace_list", {}))
    assert base64.b64decode(read["content_base64"]) == payload
    assert read["workspace_id"] == "proj/alpha"
    assert {"path": "blob.bin", "kind": "file", "size": len(payload)} in listed["entries"]
    assert default["workspace_id"] != "proj/alpha"  # the session's own default workspace
    assert all(e["path"] != "blob.bin" for e in default["entries"])
    assert "proj/alpha" in {w["workspace_id"] for w in workspaces["workspaces"]}


async def test_a_file_larger_than_the_sdks_default_body_limit_is_written_and_read_back(http_server: HttpServer) -> None:
    payload = bytes(range(256)) * (6 * 4096)  # 6 MiB, 8 MiB as base64: over the SDK's 4 MiB default
    async with http_session(http_server.url) as session:
        encoded = base64.b64encode(payload).decode()
        written = await session.call_tool("write_file", {"path": "big.bin", "content": encoded, "encoding": "base64"})
        read = await session.call_tool("read_file", {"path": "big.bin", "encoding": "base64"})
    assert result_of(written)["size"] == len(payload)
    assert base64.b64decode(result_of(read)["content_base64"]) == payload


async def test_a_background_command_is_polled_fed_and_killed(http_server: HttpServer) -> None:
    tag = new_tag("mcp-bg")
    async with http_session(http_server.url) as session:
        started = result_of(
            await session.call_tool(
                "workspace_exec",
                {
                    "command": "echo ready; while read line; do echo got:$line; done; sleep 60",
                    "background": True,
                    "env": tagged(tag),
                },
            )
        )
        await wait_processes(tag, 1)
        polled = result_of(
            await session.call_tool("workspace_poll", {"session_id": started["session_id"], "wait_ms": 2000})
        )
        fed = result_of(
            await session.call_tool(
                "workspace_write_stdin",
                {"session_id": started["session_id"], "input": "hello", "append_newline": True, "wait_ms": 2000},
            )
        )
        killed = result_of(await session.call_tool("workspace_kill", {"session_id": started["session_id"]}))
    assert started["status"] == "running"
    assert "ready" in polled["output"]
    assert "got:hello" in fed["output"]
    assert killed["status"] == "killed"
    assert wait_no_process(tag) == []


async def test_mistakes_come_back_as_error_results_naming_the_fix(http_server: HttpServer) -> None:
    async with http_session(http_server.url) as session:
        missing = await session.call_tool("read_file", {"path": "nope.txt"})
        bad_b64 = await session.call_tool("write_file", {"path": "x", "content": "%%%", "encoding": "base64"})
        bad_id = await session.call_tool("list_files", {"workspace_id": "../etc"})
        escape = await session.call_tool("write_file", {"path": "../../outside", "content": "x"})
        unknown = await session.call_tool("no_such_tool", {})
    assert all(r.isError for r in (missing, bad_b64, bad_id, escape, unknown))
    assert "base64" in result_of(bad_b64)["error"]
    assert "workspace_id" in result_of(bad_id)["error"]
    assert result_of(escape)["error_type"] == "PathDenied"
    assert "known:" in result_of(unknown)["error"]
