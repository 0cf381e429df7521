"""Warm kernels of ``execspace serve`` (``--warm-kernels``, the default): each pooled ``code-interpreter-v1`` sandbox
holds its default Python context's kernel, started in its own session before the create, through the official
``e2b-code-interpreter`` SDK. The kernel's start time (``/proc/self/stat``, in clock ticks since boot) says when it
started: before the create (warm) or after it (cold)."""

from __future__ import annotations

import ast
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Server, running_server
from .test_pool import pool_status

ci = pytest.importorskip("e2b_code_interpreter", reason="pip install 'execspace[dev]' (e2b-code-interpreter)")
pytestmark = pytest.mark.timeout(180)

TEMPLATE = "code-interpreter-v1"
#: The kernel's own start (seconds since boot), its sandbox's id and one envVar of its create, as a tuple.
PROBE = (
    "import os\n"
    "fields = open('/proc/self/stat').read().rsplit(')', 1)[1].split()\n"
    "(int(fields[19]) / os.sysconf('SC_CLK_TCK'), os.environ['E2B_SANDBOX_ID'], os.environ.get('GREETING'))"
)


def serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> Iterator[Server]:
    pool = ("--pool-size", f"{TEMPLATE}=2", "--pool-size", "0", "--allow-internet-access")
    with running_server(tmp_path / "ws", *pool, *flags) as server:
        for name, value in server.sdk_env().items():
            monkeypatch.setenv(name, value)
        deadline = time.monotonic() + 90
        while (status := pool_status(server)[TEMPLATE])["ready"] < 2 or status["kernels"] < int(not flags) * 2:
            assert time.monotonic() < deadline, f"the pool did not fill: {status}"
            time.sleep(0.05)
        yield server


@pytest.fixture()
def warm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    yield from serve(tmp_path, monkeypatch)


def boot_seconds() -> float:
    """Now, in seconds since boot, less one clock tick: a process's start time is counted in whole ticks."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) - 1 / os.sysconf("SC_CLK_TCK")


def probe(sbx: ci.Sandbox) -> tuple[float, str, str | None]:
    execution = sbx.run_code(PROBE)
    assert execution.error is None, execution.error
    found: tuple[float, str, str | None] = ast.literal_eval(execution.text or "")
    return found


def test_a_pooled_sandbox_runs_its_first_cell_on_a_kernel_started_before_its_create(warm: Server) -> None:
    assert pool_status(warm)[TEMPLATE]["kernels"] == 2
    before = boot_seconds()
    sbx = ci.Sandbox.create(envs={"GREETING": "hello"}, timeout=60)
    try:
        started, sandbox_id, greeting = probe(sbx)
        assert started < before, "the kernel started before the create: it was warm"
        assert (sandbox_id, greeting) == (sbx.sandbox_id, "hello")  # its own sandbox's, with the create's envVars
        assert sbx.run_code("import subprocess; subprocess.run(['sh', '-c', 'echo $GREETING'])").logs.stdout == [
            "hello\n"
        ]
        assert sbx.run_code("x = 41\nx + 1").text == "42"
        assert [c.language for c in sbx.list_code_contexts()] == ["python", "javascript"]  # its defaults, as E2B's
    finally:
        sbx.kill()


def test_each_pooled_sandbox_has_a_kernel_of_its_own(warm: Server) -> None:
    first, second = ci.Sandbox.create(timeout=60), ci.Sandbox.create(timeout=60)
    try:
        first.run_code("mine = 'first'")
        assert second.run_code("'mine' in globals()").text == "False"
        assert probe(first)[1] == first.sandbox_id and probe(second)[1] == second.sandbox_id
    finally:
        first.kill()
        second.kill()


def test_a_sandbox_with_the_network_gets_a_kernel_started_with_it(warm: Server) -> None:
    before = boot_seconds()
    sbx = ci.Sandbox.create(allow_internet_access=True, timeout=60)
    try:
        assert probe(sbx)[0] >= before, "the warm kernel started offline: the sandbox's first cell started its own"
    finally:
        sbx.kill()


def test_without_warm_kernels_the_first_cell_starts_the_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for server in serve(tmp_path, monkeypatch, "--no-warm-kernels"):
        assert pool_status(server)[TEMPLATE]["kernels"] == 0
        before = boot_seconds()
        sbx = ci.Sandbox.create(timeout=60)
        try:
            assert probe(sbx)[0] >= before
        finally:
            sbx.kill()
