"""``GET /metrics`` of ``execspace serve`` (docs/operations.md "Metrics"), read by Prometheus's own parser while the
official SDK acts: the live sandboxes, creates, kills, command outcomes and their latency, file writes, a 429 of
a full server, each following the action; and who may scrape (``--metrics open|key|off``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import CommandExitException, Sandbox

from execspace.scrape import MetricsAccess, MetricsEndpoint, TargetGroup

from .conftest import Server, running_server

prometheus_parser = pytest.importorskip("prometheus_client.parser", reason="needs the serve extra")

pytestmark = pytest.mark.timeout(180)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def e2b_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """This module's server (the SDK is pointed at it): room for two sandboxes, none pooled."""
    with running_server(tmp_path_factory.mktemp("metrics"), "--max-sandboxes", "2", "--pool-size", "0") as server:
        yield server


def scrape(server: Server, headers: dict[str, str] | None = None) -> Samples:
    answer = httpx.get(f"{server.url}/metrics", headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in prometheus_parser.text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def api_key(server: Server) -> dict[str, str]:
    return {"X-API-KEY": server.key}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_follow_the_sandboxes_their_commands_and_a_full_server(e2b_server: Server) -> None:
    before = scrape(e2b_server)
    assert value(before, "execspace_sandboxes", template="base", state="running") == 0
    first, second = Sandbox.create(timeout=120), Sandbox.create(timeout=120)
    try:
        two = scrape(e2b_server)
        assert value(two, "execspace_sandboxes", template="base", state="running") == 2
        assert value(two, "execspace_sandboxes_created_total", template="base") == 2
        # once, without the SDK (which retries a 429 on its own)
        full = httpx.post(f"{e2b_server.url}/v2/sandboxes", json={"templateID": "base"}, headers=api_key(e2b_server))
        assert full.status_code == 429
        first.commands.run("true")
        with pytest.raises(CommandExitException):
            first.commands.run("exit 3")
        with pytest.raises(CommandExitException):
            first.commands.run("kill -KILL $$")
        first.files.write("note.txt", "12345")
        first.files.remove("note.txt")
        second.kill()
        after = scrape(e2b_server)
    finally:
        first.kill()
        second.kill()
    assert value(after, "execspace_sandboxes", template="base", state="running") == 1
    assert value(after, "execspace_sandboxes_killed_total", template="base") == 1
    assert value(after, "execspace_refusals_total", reason="capacity") == 1
    assert value(after, "execspace_http_requests_total", route="/v2/sandboxes", code="429") == 1
    assert value(after, "execspace_http_requests_total", route="/v2/sandboxes", code="201") == 2
    outcomes = {o: value(after, "execspace_commands_total", outcome=o) for o in ("ok", "error", "signal", "limit")}
    assert outcomes == {"ok": 1, "error": 1, "signal": 1, "limit": 0}
    assert value(after, "execspace_commands_started_total") == 3
    assert value(after, "execspace_command_duration_seconds_count") == 3
    assert value(after, "execspace_command_duration_seconds_bucket", le="+Inf") == 3
    assert value(after, "execspace_file_operations_total", operation="write") == 1
    assert value(after, "execspace_file_operations_total", operation="remove") == 1
    assert value(after, "execspace_file_written_bytes_total") == 5
    gone = scrape(e2b_server)
    assert value(gone, "execspace_sandboxes", template="base", state="running") == 0
    assert value(gone, "execspace_sandboxes_killed_total", template="base") == 2


def test_a_sandbox_paths_metrics_are_envds_not_the_servers(e2b_server: Server) -> None:
    sbx = Sandbox.create(timeout=60)
    try:
        headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
        answer = httpx.get(f"{e2b_server.url}/metrics", headers=headers)
        assert answer.status_code in (401, 501) and "execspace_" not in answer.text
    finally:
        sbx.kill()


@pytest.mark.parametrize("access", ["key", "off"])
def test_who_may_scrape(tmp_path: Path, access: str) -> None:
    with running_server(tmp_path / "ws", "--metrics", access, "--pool-size", "0") as server:
        anonymous = httpx.get(f"{server.url}/metrics")
        keyed = httpx.get(f"{server.url}/metrics", headers={"X-API-KEY": server.key})
        bearer = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {server.key}"})
        wrong = httpx.get(f"{server.url}/metrics", headers={"X-API-KEY": server.key + "0"})
    if access == "key":
        assert (anonymous.status_code, wrong.status_code) == (401, 401)
        assert "--metrics key" in anonymous.text
        assert keyed.status_code == bearer.status_code == 200
        assert "execspace_sandboxes{" in keyed.text and "execspace_sandboxes{" in bearer.text
    else:
        assert {anonymous.status_code, keyed.status_code, bearer.status_code, wrong.status_code} == {404}
        assert "metrics are off" in keyed.text


@pytest.mark.parametrize("access", ["open", "key", "off"])
def test_targets_are_answered_under_the_metrics_rule_in_prometheus_http_sd_format(access: MetricsAccess) -> None:
    """``GET /metrics/targets`` (the front door of serve --ray lists its nodes' servers there) is answered under the
    same rule as ``/metrics``; a server with no targets leaves the path to its application."""
    from prometheus_client import CollectorRegistry

    groups: list[TargetGroup] = [{"targets": ["10.0.0.7:41234"], "labels": {"execspace_node": "f7f7"}}]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 418, "headers": []})
        await send({"type": "http.response.body", "body": b"the application's"})

    registry = None if access == "off" else CollectorRegistry()
    listing = MetricsEndpoint(app, registry, access, lambda: ["k3y"], targets=lambda: groups)
    plain = MetricsEndpoint(app, registry, access, lambda: ["k3y"])

    async def get(endpoint: MetricsEndpoint, headers: dict[str, str]) -> httpx.Response:
        transport = httpx.ASGITransport(app=endpoint)
        async with httpx.AsyncClient(transport=transport, base_url="http://front") as client:
            return await client.get("/metrics/targets", headers=headers)

    anonymous = asyncio.run(get(listing, {}))
    bearer = asyncio.run(get(listing, {"Authorization": "Bearer k3y"}))
    assert asyncio.run(get(plain, {"X-API-KEY": "k3y"})).status_code == 418
    if access == "off":
        assert anonymous.status_code == bearer.status_code == 404
        return
    assert bearer.status_code == 200 and bearer.headers["content-type"] == "application/json"
    assert bearer.json() == groups
    assert anonymous.status_code == (401 if access == "key" else 200)
