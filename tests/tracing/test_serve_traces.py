"""``execspace serve`` with the OTEL_* variables: each request is a span (route, status, sandbox id, template) whose
parent is the trace context the official e2b SDK sent (``headers={"traceparent": ...}``), and what a request
causes (the workspace made, the command run, the clean-up) are its children."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="needs the serve extra (pip install 'execspace[serve]')")
pytest.importorskip("e2b", reason="the server is tested with the official e2b SDK (pip install 'execspace[dev]')")

from e2b import CommandExitException, Sandbox

from execspace import InputSpec, RunProgramSpec, open_engine
from execspace.testing.binding import make_traversable
from execspace.testing.processes import read_until, terminate
from execspace.tracing import from_environment
from tests.tracing.receiver import Receiver, otlp_receiver

API_KEY = "e2b_" + "0123456789abcdef" * 2


@contextlib.contextmanager
def traced_server(root: Path, receiver: Receiver) -> Iterator[str]:
    root.mkdir(parents=True, exist_ok=True)
    make_traversable(root)
    env = {**os.environ, "EXECSPACE_DAEMON": "off", "PYTHONUNBUFFERED": "1", **receiver.env()}
    argv = [sys.executable, "-m", "execspace", "serve", "--port", "0", "--api-key", API_KEY]
    argv += ["--workspace-root", str(root), "--kernel-environment", "none"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        assert process.stdout is not None
        found, seen = read_until(process.stdout, rb"listening on (\S+)", 60)
        assert found is not None, seen.decode(errors="replace")
        yield found.group(1).decode()
    finally:
        terminate(process, grace=20)
        assert process.stdout is not None
        process.stdout.close()


def test_serve_requests_are_spans_under_the_callers_trace(tmp_path: Path) -> None:
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    traceparent = {"traceparent": f"00-{trace_id}-{parent_id}-01"}
    with otlp_receiver() as receiver:
        with traced_server(tmp_path / "ws", receiver) as url:
            sbx = Sandbox.create(api_url=url, sandbox_url=url, api_key=API_KEY, timeout=60, headers=traceparent)
            with pytest.raises(CommandExitException):  # what the SDK raises for a non-zero exit
                sbx.commands.run("sh -c 'exit 4'", timeout=30)
            sbx.kill(headers=traceparent)
            assert not sbx.is_running()  # GET /health of a sandbox gone: 502
            sandbox_id = sbx.sandbox_id
        # the server exited (SIGTERM): its tracer was shut down, its spans exported
        spans = list(receiver.spans)
    by_id = {s.span_id: s for s in spans}
    create = next(s for s in spans if s.name == "POST /v2/sandboxes")
    assert (create.trace_id, create.parent_span_id) == (trace_id, parent_id)
    assert create.kind == 2  # SPAN_KIND_SERVER
    assert create.attributes["http.route"] == "/v2/sandboxes"
    assert create.attributes["http.response.status_code"] == 201
    assert create.attributes["execspace.sandbox.id"] == sandbox_id
    assert create.attributes["execspace.template"] == "base"
    kill = next(s for s in spans if s.name == "DELETE /sandboxes/{sandboxID}")
    assert (kill.trace_id, kill.parent_span_id) == (trace_id, parent_id)
    assert kill.attributes["execspace.sandbox.id"] == sandbox_id
    cleanup = next(
        s
        for s in spans
        if s.name == "execspace.workspace.cleanup" and s.attributes["execspace.workspace.id"] == f"e2b/{sandbox_id}"
    )
    assert cleanup.parent_span_id == kill.span_id  # what the kill caused
    gone = next(s for s in spans if s.name == "GET /health")
    assert gone.attributes["http.response.status_code"] == 502
    assert (gone.status_code, gone.attributes["error.type"]) == (2, "502")  # a server span's 5xx is its error
    assert create.status_code != 2
    # the command: its request's span (no traceparent on envd's requests: a trace of its own) parents its run
    start = next(s for s in spans if s.name == "POST /process.Process/Start")
    assert start.attributes["execspace.sandbox.id"] == sandbox_id and start.attributes["execspace.template"] == "base"
    run = next(s for s in spans if s.name == "execspace.run" and s.parent_span_id == start.span_id)
    assert run.attributes["execspace.run.exit_code"] == 4
    assert run.attributes["execspace.backend"] == "sandbox" and run.attributes["execspace.mode"] == "session"
    assert run.attributes["process.command"] == "/bin/bash"  # argv[0]: the command line itself stays out
    assert all("exit 4" not in str(v) for s in spans for v in s.attributes.values())
    assert all(not s.parent_span_id or s.parent_span_id in by_id or s.parent_span_id == parent_id for s in spans)


async def test_the_e2b_backends_runs_are_spans(tmp_path: Path) -> None:
    with otlp_receiver() as receiver, otlp_receiver() as client_side:
        with traced_server(tmp_path / "ws", receiver) as url:
            tracer = from_environment("e2b-client", client_side.env())
            assert tracer is not None
            try:
                async with open_engine("e2b", api_url=url, sandbox_url=url, api_key=API_KEY, tracer=tracer) as engine:
                    ws = await engine.manager.create_workspace("remote")
                    await engine.fs.stage_inputs(ws, [InputSpec(b"x", "work/x.txt")])
                    await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", "exit 3"]))
                    started = await engine.runner.start_program(ws, RunProgramSpec("sh", ["-c", "exit 5"]))
                    await started.wait()
                    await engine.manager.cleanup(ws)
            finally:
                tracer.close()
        runs = client_side.named("execspace.run")
        steps = {s.name for s in client_side.spans}
    assert {"execspace.workspace.create", "execspace.stage", "execspace.workspace.cleanup"} <= steps
    assert sorted(r.attributes["execspace.run.exit_code"] for r in runs) == [3, 5]
    assert {(r.attributes["execspace.backend"], r.attributes["execspace.isolation"]) for r in runs} == {
        ("e2b", "remote")
    }


async def test_the_e2b_backends_snapshots_forks_and_restores_are_spans(tmp_path: Path) -> None:
    """As the host backends': the snapshot's span names the snapshot, the fork's its source and count; the
    snapshot requests carry the caller's span, so serve's spans of them are its children."""
    with otlp_receiver() as server_side, otlp_receiver() as client_side:
        with traced_server(tmp_path / "ws", server_side) as url:
            tracer = from_environment("e2b-client", client_side.env())
            assert tracer is not None
            try:
                async with open_engine("e2b", api_url=url, sandbox_url=url, api_key=API_KEY, tracer=tracer) as engine:
                    ws = await engine.manager.create_workspace("branched")
                    snap = await engine.manager.snapshot(ws)
                    forks = await engine.manager.fork(ws, 2)
                    await engine.manager.restore(ws, snap)
                    for each in (ws, *forks):
                        await engine.manager.cleanup(each)
            finally:
                tracer.close()
        server_spans = list(server_side.spans)
    (snapshot,) = client_side.named("execspace.workspace.snapshot")
    assert snapshot.attributes["execspace.backend"] == "e2b"
    assert snapshot.attributes["execspace.workspace.id"] == "branched"
    assert snapshot.attributes["execspace.snapshot.id"] == snap.id
    (fork,) = client_side.named("execspace.workspace.fork")
    assert fork.attributes["execspace.fork.source"] == "branched" and fork.attributes["execspace.fork.count"] == 2
    (restore,) = client_side.named("execspace.workspace.restore")
    assert restore.attributes["execspace.workspace.id"] == "branched"
    assert all(s.status_code != 2 for s in (snapshot, fork, restore))
    taken = [s for s in server_spans if s.name == "POST /sandboxes/{sandboxID}/snapshots"]
    assert sorted((s.trace_id, s.parent_span_id) for s in taken) == sorted(
        [(snapshot.trace_id, snapshot.span_id), (fork.trace_id, fork.span_id)]
    )
