"""Metrics and the audit log of ``execspace mcp`` (docs/operations.md), through the official MCP client: each tool
call's line is in the audit file by the time its result arrives, naming the workspace and the token's key id and
never a file's content, an environment value or the token; ``GET /metrics`` follows the calls (Prometheus's own
parser), open to a scraper without the token by default; stdio audits the same way."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from execspace.audit import key_id
from tests.support import audit_entries

from .conftest import ONLY_MCP1, TOKEN, HttpServer, http_session, running_http_server, stdio_session, write_config

prometheus_parser = pytest.importorskip("prometheus_client.parser", reason="needs the mcp extra")

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HttpServer, Path]]:
    directory = tmp_path_factory.mktemp("mcp-ops")
    audit = directory / "audit.jsonl"
    with running_http_server(directory, "--backend", "sandbox", "--audit-log", str(audit)) as server:
        yield server, audit


def samples(url: str, headers: dict[str, str] | None = None) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    answer = httpx.get(url.removesuffix("/mcp") + "/metrics", headers=headers)
    assert answer.status_code == 200, answer.text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in prometheus_parser.text_string_to_metric_families(answer.text)
        for s in family.samples
    }


@ONLY_MCP1
async def test_each_tool_call_has_its_line_and_the_metrics_follow(audited: tuple[HttpServer, Path]) -> None:
    server, audit = audited
    team = key_id(TOKEN)
    before = samples(server.url)
    async with http_session(server.url) as session:
        await session.call_tool("workspace_create", {"workspace_id": "ops/one"})
        assert audit_entries(audit, "workspace.create", workspace="ops/one", key_id=team, created=True)
        ran = {"workspace_id": "ops/one", "command": "echo $SECRET_NAME; exit 4", "env": {"SECRET_NAME": "val-8812"}}
        await session.call_tool("workspace_exec", ran)
        (run,) = audit_entries(audit, "command.run", workspace="ops/one")
        assert (run["command"], run["exit_code"], run["env_names"]) == (ran["command"], 4, ["SECRET_NAME"])
        content = {"workspace_id": "ops/one", "path": "a.txt", "content": "content-6630"}
        await session.call_tool("write_file", content)
        assert audit_entries(audit, "file.write", workspace="ops/one", size=12)
        await session.call_tool("remove_file", {"workspace_id": "ops/one", "path": "a.txt"})
        assert audit_entries(audit, "file.remove", workspace="ops/one")
        await session.call_tool("read_file", {"workspace_id": "ops/one", "path": "../../../etc/passwd"})
        (refused,) = audit_entries(audit, "policy.refusal", workspace="ops/one", tool="read_file")
        assert refused["error_type"] == "PathDenied"
        await session.call_tool("workspace_close", {"workspace_id": "ops/one"})
        assert audit_entries(audit, "workspace.close", workspace="ops/one", key_id=team)
    after = samples(server.url)
    text = audit.read_text()
    assert "val-8812" not in text and "content-6630" not in text and TOKEN not in text

    def calls(tool: str, outcome: str) -> float:
        key = ("execspace_mcp_tool_calls_total", frozenset({("tool", tool), ("outcome", outcome)}))
        return after.get(key, 0) - before.get(key, 0)

    assert calls("workspace_exec", "ok") == 1 and calls("write_file", "ok") == 1
    assert calls("read_file", "error") == 1 and calls("workspace_close", "ok") == 1
    duration = ("execspace_mcp_tool_call_duration_seconds_count", frozenset({("tool", "workspace_exec")}))
    assert after[duration] - before.get(duration, 0) == 1
    assert after[("execspace_mcp_workspaces", frozenset())] == 0


@ONLY_MCP1
async def test_the_open_workspaces_are_a_gauge(audited: tuple[HttpServer, Path]) -> None:
    server, _ = audited
    async with http_session(server.url) as session:
        await session.call_tool("workspace_create", {"workspace_id": "ops/gauge"})
        assert samples(server.url)[("execspace_mcp_workspaces", frozenset())] == 1
        await session.call_tool("workspace_close", {"workspace_id": "ops/gauge"})
    assert samples(server.url)[("execspace_mcp_workspaces", frozenset())] == 0


def test_metrics_key_takes_the_bearer_token(tmp_path: Path) -> None:
    with running_http_server(tmp_path, "--backend", "local", "--metrics", "key") as server:
        base = server.url.removesuffix("/mcp")
        assert httpx.get(base + "/metrics").status_code == 401
        assert httpx.get(base + "/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert (
            "execspace_mcp_workspaces"
            in httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
        )


async def test_stdio_audits_without_a_key(tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    config = write_config(tmp_path)
    async with stdio_session("--backend", "local", "--config", str(config), "--audit-log", str(audit)) as session:
        await session.call_tool("workspace_exec", {"command": "true"})
        (run,) = audit_entries(audit, "command.run")
    assert run["key_id"] is None and run["exit_code"] == 0 and run["workspace"]
