"""Traces of serve --ray on a local cluster, received by a real OTLP receiver: the front door's span of each
request it answers is the child of the caller's ``traceparent``, and the node's server's span of the request the
front door sent on is the front door's child, for a create (a control call) and a command (a proxied stream)."""

from __future__ import annotations

import json
import secrets
import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from tests.tracing.receiver import ReceivedSpan, Receiver, otlp_receiver

from .conftest import API_KEY, LocalCluster, started_cluster

pytest.importorskip(
    "opentelemetry.exporter.otlp.proto.http", reason="needs the otel extra (pip install 'execspace[otel]')"
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DOOR, NODE = "execspace-door", "execspace-node"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as found:
        yield found


@pytest.fixture(scope="module")
def traced_cluster(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[LocalCluster]:
    """One node whose Ray processes (and so its server) export their traces to ``receiver``."""
    node_env = receiver.env(OTEL_SERVICE_NAME=NODE)
    with started_cluster(tmp_path_factory.mktemp("cluster"), {"env_vars": node_env}, []) as cluster:
        yield cluster


def _command(door_url: str, sbx: Sandbox, traceparent: dict[str, str]) -> httpx.Response:
    """``sh -c 'exit 3'`` through envd's Connect API, with the caller's trace context (the SDK sends its
    ``headers=`` on the control plane only)."""
    message = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", "exit 3"]}}).encode()
    headers = {
        **sbx.connection_config.sandbox_headers,
        "e2b-sandbox-id": sbx.sandbox_id,
        "e2b-sandbox-port": "49983",
        "content-type": "application/connect+json",
        "connect-protocol-version": "1",
        **traceparent,
    }
    envelope = b"\x00" + struct.pack(">I", len(message)) + message
    return httpx.post(f"{door_url}/process.Process/Start", content=envelope, headers=headers, timeout=60)


def _one(spans: list[ReceivedSpan], name: str, service: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name and s.service == service]
    assert len(found) == 1, [(s.name, s.service) for s in spans]
    return found[0]


def test_the_front_doors_span_is_the_callers_child_and_the_nodes_parent(
    traced_cluster: LocalCluster, receiver: Receiver, tmp_path: Path
) -> None:
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    traceparent = {"traceparent": f"00-{trace_id}-{parent_id}-01"}
    with traced_cluster.front_door(API_KEY, env=receiver.env(OTEL_SERVICE_NAME=DOOR)) as door:
        sbx = Sandbox.create(**door.sdk(), timeout=120, headers=traceparent)
        try:
            ran = _command(door.url, sbx, traceparent)
            assert ran.status_code == 200, ran.text
            assert b'"exitCode":3' in ran.content.replace(b" ", b"")
        finally:
            sbx.kill()
        receiver.wait_for(  # the node's server exports as it goes (its batch: every few seconds)
            lambda r: any(s.service == NODE and s.name == "POST /process.Process/Start" for s in r.spans), 60
        )
    # the front door exited (SIGTERM): its tracer was closed, its spans exported
    spans = [s for s in receiver.spans if s.trace_id == trace_id]
    for route in ("POST /v2/sandboxes", "POST /process.Process/Start"):
        door_span = _one(spans, route, DOOR)
        node_span = _one(spans, route, NODE)
        assert door_span.kind == node_span.kind == 2  # SPAN_KIND_SERVER
        assert door_span.parent_span_id == parent_id, route
        assert node_span.parent_span_id == door_span.span_id, route
        assert door_span.attributes["http.route"] == route.split(" ", 1)[1]
        assert door_span.attributes["execspace.sandbox.id"] == sbx.sandbox_id
    create = _one(spans, "POST /v2/sandboxes", DOOR)
    assert create.attributes["http.response.status_code"] == 201
    assert create.attributes["execspace.template"] == "base"
    # what the node's request caused is the node's span's child: the command's run
    start = _one(spans, "POST /process.Process/Start", NODE)
    run = next(s for s in spans if s.name == "execspace.run" and s.parent_span_id == start.span_id)
    assert run.attributes["execspace.run.exit_code"] == 3
