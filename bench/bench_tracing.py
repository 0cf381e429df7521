"""Tracing benchmarks (15): what OpenTelemetry tracing adds to a run, and to start-up.

Per run: ``/bin/true`` through ``engine.runner.run_program`` on an engine traced to a local OTLP/HTTP receiver (the
OTEL_* variables' tracer: a batch span processor exporting http/protobuf) against the same backend's engine without
a tracer, interleaved, in one process. Start-up: ``python -c 'import execspace'`` and ``execspace run --backend local
-- true`` as fresh processes, with the OTEL_* variables set (the receiver's) against without them.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import execspace
from bench_core import Plan, Report, Row, Stats, backend_ready, interleaved, ok, scratch_dir
from execspace import RunProgramSpec
from execspace.tracing import from_environment

SECTION = "15 tracing"


class _Sink(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that takes every export (200, empty answer) and counts the bytes."""

    received = 0

    def do_POST(self) -> None:
        _Sink.received += len(self.rfile.read(int(self.headers.get("content-length", 0))))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _receiver() -> Iterator[dict[str, str]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
        }
    finally:
        server.shutdown()
        server.server_close()


async def _run_overhead(backend: str, plan: Plan, report: Report, variables: dict[str, str], target: bool) -> None:
    tracer = from_environment("bench", variables)
    assert tracer is not None
    true = RunProgramSpec("/bin/true")
    iters = plan.sandbox_true_iters
    try:
        with scratch_dir("bench-tracing-on-") as on_root, scratch_dir("bench-tracing-off-") as off_root:
            async with (
                execspace.open_engine(backend, workspace_root=on_root, tracer=tracer) as traced,  # type: ignore[call-overload]
                execspace.open_engine(backend, workspace_root=off_root) as plain,  # type: ignore[call-overload]
            ):
                on_ws = await traced.manager.create_workspace("on")
                off_ws = await plain.manager.create_workspace("off")

                async def on() -> None:
                    ok((await traced.runner.run_program(on_ws, true)).exit_code, "a traced run")

                async def off() -> None:
                    ok((await plain.runner.run_program(off_ws, true)).exit_code, "a run")

                lib, base = await interleaved([on, off], iters, min(plan.warmup, 20))
    finally:
        tracer.close()
    row = Row(
        SECTION,
        f"{backend}: /bin/true traced (OTLP to a local receiver)",
        "ms",
        Stats.of(lib, 1e3),
        Stats.of(base, 1e3),
        "the same backend, no tracer",
        target="≤ +5 %" if target else "",
    )
    if target:
        row.passed = row.ratio is not None and row.ratio <= 1.05
    report.rows.append(row)


def _startup(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, timeout=60)
    elapsed = time.perf_counter() - t0
    ok(done.returncode, " ".join(argv[-3:]))
    return elapsed


def _startups(report: Report, variables: dict[str, str], iters: int) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {"EXECSPACE_DAEMON": "off"}
    traced = clean | variables
    cases = [
        ("python -c 'import execspace'", [sys.executable, "-c", "import execspace"]),
        ("execspace run --backend local -- true", [sys.executable, "-m", "execspace", "run", "--backend", "local"]),
    ]
    for name, argv in cases:
        full = argv if "import" in name else [*argv, "--", "true"]
        on: list[float] = []
        off: list[float] = []
        _startup(full, clean)  # the page cache warm for both
        for i in range(iters):
            for side, env in ((on, traced), (off, clean)) if i % 2 == 0 else ((off, clean), (on, traced)):
                side.append(_startup(full, env))
        report.rows.append(
            Row(SECTION, f"start-up: {name}, OTEL_* set", "ms", Stats.of(on, 1e3), Stats.of(off, 1e3), "OTEL_* unset")
        )


async def run_tracing(plan: Plan, report: Report, log: Callable[[str], None]) -> None:
    try:
        import opentelemetry.sdk  # noqa: F401
    except ImportError:
        report.notes.append("tracing benchmarks skipped: pip install 'execspace[otel]'")
        return
    with _receiver() as variables:
        if await backend_ready("sandbox", SECTION, report, log):
            log("tracing: sandbox runs, traced vs not")
            await _run_overhead("sandbox", plan, report, variables, target=True)
        log("tracing: local runs, traced vs not")
        await _run_overhead("local", plan, report, variables, target=False)
        log("tracing: start-up with and without the OTEL_* variables")
        _startups(report, variables, plan.cli_iters)
