"""Traces of the library and the CLI, received by a real OTLP/HTTP receiver (tests/tracing/receiver.py): the spans
of workspaces, staging, runs, collection, snapshots and forks with their attributes; the OTEL_* variables that
turn them on; nothing of a run's environment or files in any span; nothing imported when tracing is off."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from execspace import InputSpec, RunProgramSpec, SupportsSnapshots, open_engine
from execspace.errors import PathDenied, SetupFailed
from execspace.tracing import NO_TRACER, from_environment, tracing_requested
from tests.backends.container_support import container_engine
from tests.backends.docker_fixture import Daemon
from tests.support import CLI, daemon_served, running_daemon
from tests.tracing.receiver import ReceivedSpan, otlp_receiver

MARKER = "trace-marker-5f1c0e9d"


def _by_name(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    found: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        found.setdefault(span.name, []).append(span)
    return found


async def test_a_library_run_exports_the_spans_of_its_steps_with_their_attributes() -> None:
    with otlp_receiver() as receiver:
        tracer = from_environment("library-test", receiver.env())
        assert tracer is not None
        try:
            async with open_engine("sandbox", tracer=tracer) as engine:
                ws = await engine.manager.create_workspace("traced")
                await engine.fs.stage_inputs(ws, [InputSpec(b"x", "work/inputs/x.txt")])
                failed = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", "echo four; exit 3"]))
                slow = await engine.runner.run_program(ws, RunProgramSpec("sleep", ["30"], timeout=0.3))
                started = await engine.runner.start_program(ws, RunProgramSpec("sh", ["-c", "exit 5"]))
                await started.wait()
                assert isinstance(engine.manager, SupportsSnapshots)
                snapshot = await engine.manager.snapshot(ws)
                forks = await engine.manager.fork(snapshot, 2)
                await engine.fs.collect_outputs(ws)
                for fork in forks:
                    await engine.manager.cleanup(fork)
                await engine.manager.cleanup(ws)
        finally:
            tracer.close()
        spans = _by_name(receiver.spans)
    assert (failed.exit_code, slow.timed_out) == (3, True)
    runs = {span.attributes["process.exit.code"]: span.attributes for span in spans["execspace.run"]}
    assert runs[3] == runs[3] | {
        "execspace.run.exit_code": 3,
        "execspace.backend": "sandbox",
        "execspace.isolation": "process",
        "execspace.mode": "per-run",
        "process.command": "sh",
        "execspace.workspace.id": "traced",
        "execspace.run.timed_out": False,
        "execspace.run.stdout_bytes": 5,
        "execspace.run.stderr_bytes": 0,
    }
    assert 0 < float(runs[3]["execspace.run.duration_s"]) < 30
    assert "execspace.run.limit_hit" not in runs[3]
    timed_out = next(a for a in runs.values() if a["process.command"] == "sleep")
    assert (timed_out["execspace.run.timed_out"], timed_out["execspace.run.limit_hit"]) == (True, "timeout")
    assert runs[5]["process.command"] == "sh"  # start_program's span ends with the program, with its result
    assert [s.attributes["execspace.stage.inputs"] for s in spans["execspace.stage"]] == [1]
    assert spans["execspace.collect"][0].attributes["execspace.collect.files"] == 0
    assert spans["execspace.workspace.snapshot"][0].attributes["execspace.snapshot.id"] == snapshot.id
    assert spans["execspace.workspace.fork"][0].attributes["execspace.fork.count"] == 2
    assert len(spans["execspace.workspace.cleanup"]) == 3
    assert spans["execspace.workspace.create"][0].attributes["execspace.workspace.id"] == "traced"
    assert {s.service for s in receiver.spans} == {"library-test"}


async def test_a_run_inside_a_callers_span_is_its_child() -> None:
    with otlp_receiver() as receiver:
        tracer = from_environment("library-test", receiver.env())
        assert tracer is not None
        try:
            async with open_engine("local", tracer=tracer) as engine:
                with tracer.span("agent step"):
                    ws = await engine.manager.create_workspace("child")
                    await engine.runner.run_program(ws, RunProgramSpec("true"))
                await engine.manager.cleanup(ws)
        finally:
            tracer.close()
        spans = _by_name(receiver.spans)
    step = spans["agent step"][0]
    run = spans["execspace.run"][0]
    assert (run.trace_id, run.parent_span_id) == (step.trace_id, step.span_id)
    assert spans["execspace.workspace.create"][0].parent_span_id == step.span_id
    assert spans["execspace.workspace.cleanup"][0].trace_id != step.trace_id  # outside the step: a trace of its own


async def test_open_engine_traces_when_the_variables_ask_and_exports_when_it_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with otlp_receiver() as receiver:
        for name, value in receiver.env(OTEL_SERVICE_NAME="from-the-variables").items():
            monkeypatch.setenv(name, value)
        async with open_engine("local") as engine:
            ws = await engine.manager.create_workspace("env")
            await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", "exit 7"]))
            await engine.manager.cleanup(ws)
        # the engine's own tracer was shut down with it: everything is exported by now, nothing waits for a batch
        runs = receiver.named("execspace.run")
    assert [r.attributes["execspace.run.exit_code"] for r in runs] == [7]
    assert runs[0].service == "from-the-variables"


async def test_no_environment_value_or_file_content_reaches_a_span(tmp_path: Path) -> None:
    """The marker is in the run's environment, in a staged file, in the program's output and in a file it writes
    and that is collected: it is in no span, no attribute, no event, in no byte the receiver got."""
    program = f'cat inputs/secret.txt; echo "$SECRET_TOKEN"; echo "$SECRET_TOKEN" > ../out/{MARKER}.txt; ls /nope'
    with otlp_receiver() as receiver:
        tracer = from_environment("secrets-test", receiver.env())
        assert tracer is not None
        try:
            async with open_engine("sandbox", tracer=tracer) as engine:
                ws = await engine.manager.create_workspace("secrets")
                content = f"{MARKER}-file".encode()
                await engine.fs.stage_inputs(ws, [InputSpec(content, "work/inputs/secret.txt")])
                spec = RunProgramSpec("sh", ["-c", program], env={"SECRET_TOKEN": f"{MARKER}-env"})
                result = await engine.runner.run_program(ws, spec)
                await engine.fs.collect_outputs(ws)
                with pytest.raises(PathDenied, match=MARKER):  # its message names the path: the span must not
                    await engine.fs.stage_inputs(ws, [InputSpec(f"host:///etc/{MARKER}")])
                await engine.manager.cleanup(ws)
        finally:
            tracer.close()
        assert f"{MARKER}-file" in result.stdout and f"{MARKER}-env" in result.stdout  # the run did hold it
        refused = receiver.named("execspace.stage")[-1]
        assert (refused.status_code, refused.attributes["error.type"]) == (2, "PathDenied")  # STATUS_CODE_ERROR
        assert receiver.named("execspace.run") and receiver.named("execspace.collect")
        assert all(MARKER.encode() not in body for body in receiver.bodies)
        for span in receiver.spans:
            assert not any(MARKER in str(v) for v in span.attributes.values()), span
            assert not any(MARKER in e for e in span.events), span


def test_the_variables_that_turn_tracing_on() -> None:
    assert not tracing_requested({})
    assert not tracing_requested({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"})
    assert not tracing_requested({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"})
    assert not tracing_requested({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})
    assert tracing_requested({"OTEL_TRACES_EXPORTER": "console"})
    assert tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert from_environment("x", {}) is None
    assert NO_TRACER.span("a").__enter__() is NO_TRACER.start("b")  # one shared span: nothing made per call


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "zipkin"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "http/json"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "sometimes"}, "sometimes"),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "x", "OTEL_TRACES_EXPORTER": "otlp"},
            "'x'",
        ),
    ],
)
def test_variables_that_cannot_be_honoured_are_a_clear_error(variables: dict[str, str], named: str) -> None:
    with pytest.raises(SetupFailed, match="Fix: ") as caught:
        from_environment("x", variables)
    assert named in str(caught.value)


async def test_the_sampler_of_the_variables_is_used() -> None:
    with otlp_receiver() as receiver:
        tracer = from_environment("x", receiver.env(OTEL_TRACES_SAMPLER="always_off"))
        assert tracer is not None
        async with open_engine("local", tracer=tracer) as engine:
            ws = await engine.manager.create_workspace("sampled")
            await engine.runner.run_program(ws, RunProgramSpec("true"))
            await engine.manager.cleanup(ws)
        tracer.close()
        on = from_environment("x", receiver.env(OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="1"))
        assert on is not None
        with on.span("kept"):
            pass
        on.close()
        assert [s.name for s in receiver.spans] == ["kept"]


_SAYS_IMPORTED = """
import asyncio, sys
import execspace
from execspace import RunProgramSpec, open_engine
async def main():
    async with open_engine("local") as engine:
        ws = await engine.manager.create_workspace("imports")
        await engine.runner.run_program(ws, RunProgramSpec("true"))
        await engine.manager.cleanup(ws)
asyncio.run(main())
print(sorted({m.split(".")[0] for m in sys.modules if m.startswith(("opentelemetry", "execspace.otel"))}))
"""


def _clean_env(**more: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}, "EXECSPACE_DAEMON": "off", **more}


def test_without_the_variables_nothing_of_opentelemetry_is_imported() -> None:
    off = subprocess.run([sys.executable, "-c", _SAYS_IMPORTED], env=_clean_env(), capture_output=True, text=True)
    assert off.returncode == 0, off.stderr
    assert off.stdout.strip() == "[]"
    with otlp_receiver() as receiver:  # the same program with the variables does import it: the check can fail
        env = _clean_env(**receiver.env())
        on = subprocess.run([sys.executable, "-c", _SAYS_IMPORTED], env=env, capture_output=True, text=True)
    assert on.returncode == 0, on.stderr
    assert "opentelemetry" in on.stdout


_WITHOUT_OPENTELEMETRY = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Absent())
from execspace.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_variables_without_the_extra_are_an_error_naming_the_pip_command() -> None:
    argv = [sys.executable, "-c", _WITHOUT_OPENTELEMETRY, "run", "--backend", "local", "--", "true"]
    env = _clean_env(OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "pip install 'execspace[otel]'" in done.stderr and "OTEL_" in done.stderr, done.stderr


def test_a_cli_run_is_one_trace_exported_before_the_cli_exits() -> None:
    with otlp_receiver() as receiver:
        argv = [*CLI, "run", "--backend", "sandbox", "--", "sh", "-c", "exit 3"]
        env = _clean_env(**receiver.env(OTEL_SERVICE_NAME="cli-test"))
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        # no wait: the CLI returned, so what it exported is here already
        spans = _by_name(receiver.spans)
    assert done.returncode == 3, done.stderr
    root = spans["execspace run"][0]
    assert root.parent_span_id == ""
    run = spans["execspace.run"][0]
    assert run.attributes["execspace.run.exit_code"] == 3 and run.attributes["execspace.backend"] == "sandbox"
    steps = ("execspace.workspace.create", "execspace.stage", "execspace.run", "execspace.collect")
    assert all(spans[name][0].parent_span_id == root.span_id for name in steps), spans.keys()
    assert {s.trace_id for s in receiver.spans} == {root.trace_id}
    assert {s.service for s in receiver.spans} == {"cli-test"}


async def test_a_kernels_cells_are_spans_without_their_code() -> None:
    pytest.importorskip("jupyter_client", reason="needs the jupyter extra (pip install 'execspace[jupyter]')")
    with otlp_receiver() as receiver:
        tracer = from_environment("kernel-test", receiver.env())
        assert tracer is not None
        try:
            async with open_engine("jupyter", tracer=tracer) as engine:
                ws = await engine.manager.create_workspace("cells")
                cell = await engine.kernels.execute(ws, f"print('{MARKER}')")
                failed = await engine.kernels.execute(ws, "raise ValueError(1)")
                await engine.manager.cleanup(ws)
        finally:
            tracer.close()
        cells = receiver.named("execspace.kernel.execute")
    assert MARKER in cell.stdout and failed.exit_code != 0
    assert [c.attributes["execspace.kernel.exit_code"] for c in cells] == [0, failed.exit_code]
    assert cells[0].attributes["execspace.kernel.language"] == "python"
    assert cells[0].attributes["execspace.backend"] == "jupyter"
    assert all(MARKER not in str(v) for c in cells for v in c.attributes.values())


async def test_a_container_run_and_program_are_spans(docker_daemon: Daemon, test_image: str, tmp_path: Path) -> None:

    with otlp_receiver() as receiver:
        tracer = from_environment("container-test", receiver.env())
        assert tracer is not None
        try:
            async with container_engine(docker_daemon, test_image, tmp_path / "ws", tracer=tracer) as engine:
                ws = await engine.manager.create_workspace("boxed")
                await engine.fs.stage_inputs(ws, [InputSpec(b"x", "work/x.txt")])
                await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", "exit 3"]))
                started = await engine.runner.start_program(ws, RunProgramSpec("sh", ["-c", "exit 5"]))
                await started.wait()
                await engine.manager.cleanup(ws)
        finally:
            tracer.close()
        runs = receiver.named("execspace.run")
        created = receiver.named("execspace.workspace.create")
        steps = {s.name for s in receiver.spans}
    assert sorted(r.attributes["execspace.run.exit_code"] for r in runs) == [3, 5]
    assert {r.attributes["execspace.backend"] for r in runs} == {"container"}
    assert created[0].attributes["execspace.backend"] == "container"
    assert {"execspace.stage", "execspace.workspace.cleanup"} <= steps


def test_a_cli_run_through_the_warm_daemon_is_traced_with_the_callers_variables() -> None:
    with running_daemon() as daemon_env, otlp_receiver() as receiver:
        env = {k: v for k, v in daemon_env.items() if not k.startswith("OTEL_")} | receiver.env()
        served = daemon_served(env)
        done = subprocess.run(
            [*CLI, "run", "--backend", "local", "--", "sh", "-c", "exit 9"], env=env, capture_output=True, timeout=60
        )
        assert done.returncode == 9, done.stderr
        assert daemon_served(env) == served + 1  # the daemon ran it, not a fresh process
        runs = receiver.named("execspace.run")
    assert [r.attributes["execspace.run.exit_code"] for r in runs] == [9]
    assert receiver.named("execspace run")


def test_a_callers_own_provider_gets_the_spans_and_stays_open() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from execspace.otel import OtelTracer

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = OtelTracer(provider)
    with tracer.bound({"app.step": "one"}).span("outer"), tracer.span("inner"):
        pass
    tracer.close()  # not its provider to shut down
    with tracer.span("after close"):
        pass
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"outer", "inner", "after close"}
    assert spans["outer"].attributes == {"app.step": "one"}
    assert spans["inner"].parent is not None and spans["inner"].parent.span_id == spans["outer"].context.span_id
    provider.shutdown()


def test_grpc_needs_its_exporter() -> None:
    variables = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    try:
        import opentelemetry.exporter.otlp.proto.grpc.trace_exporter  # noqa: F401
    except ImportError:
        with pytest.raises(SetupFailed, match="pip install opentelemetry-exporter-otlp-proto-grpc"):
            from_environment("x", variables)
        return
    tracer = from_environment("x", variables)  # installed: a gRPC exporter to the default endpoint
    assert tracer is not None
    tracer.close()
