"""Session mode's runs without stdin or terminal: the supervisor makes their stdio and run directory and forwards
their output on the session's channel. What the host observes must be what per-run mode gives."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import execspace
from execspace import ResourceLimits, RunProgramSpec
from execspace.backends.sandbox import Profile, SandboxBackend, SandboxOptions, SandboxPolicy, SessionConfig
from execspace.registry import probe_backend
from tests.support import make_traversable

pytestmark = pytest.mark.timeout(90)


async def _engine(tmp_path: Path, mode: str, policy: SandboxPolicy | None = None) -> execspace.BaseEngine:
    probe = await probe_backend("sandbox", mode="session")
    if not probe.ok:
        pytest.skip(f"sandbox session mode unavailable: {probe.reason}")
    make_traversable(tmp_path)
    session = SessionConfig(pool_size=0) if mode == "session" else None
    options = SandboxOptions(workspace_root=tmp_path / mode, mode=mode, session=session, policy=policy)  # type: ignore[arg-type]
    return await SandboxBackend.open(options)


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[execspace.BaseEngine]:
    eng = await _engine(tmp_path, "session")
    try:
        yield eng
    finally:
        await eng.aclose()


def sh(script: str, **kw: object) -> RunProgramSpec:
    return RunProgramSpec("sh", ["-c", script], **kw)  # type: ignore[arg-type]


async def test_output_written_after_the_exit_by_an_escaped_child_arrives(engine: execspace.BaseEngine) -> None:
    ws = await engine.manager.create_workspace("late")
    # the run exits once its child has left its process group (else the group's kill at the exit takes it)
    script = "setsid sh -c 'touch apart; sleep 0.2; echo late; echo err >&2' & until [ -e apart ]; do sleep 0.01; done"
    r = await engine.runner.run_program(ws, sh(f"{script}; echo early"))
    assert r.exit_code == 0, r
    assert r.stdout == "early\nlate\n" and r.stderr == "err\n", r


async def test_a_flood_is_capped_and_holds_no_other_runs_deadline(engine: execspace.BaseEngine) -> None:
    """3 s of output as fast as it comes (GB/s through the supervisor) while another run's 0.5 s deadline passes:
    the deadline is kept, not held until the flood ends; the flood's output is capped, its size counted."""
    ws = await engine.manager.create_workspace("flood")
    flood = sh("timeout 3 cat /dev/zero", limits=ResourceLimits(output_bytes=1000), timeout=60)
    sleeper = sh("sleep 30", timeout=0.5)
    flooded, slept = await asyncio.gather(engine.runner.run_program(ws, flood), engine.runner.run_program(ws, sleeper))
    assert slept.timed_out and slept.duration < 2.0, slept
    assert flooded.exit_code == 124 and flooded.duration >= 3.0, flooded
    assert flooded.stdout_truncated and flooded.stdout_total_bytes > 100 * 1024 * 1024, flooded
    assert len(flooded.raw_stdout) < 2000


async def test_concurrent_runs_each_get_their_own_output(engine: execspace.BaseEngine) -> None:
    ws = await engine.manager.create_workspace("many")
    specs = [sh(f"echo out-{i}; echo err-{i} >&2; exit {i % 7}") for i in range(40)]
    results = await asyncio.gather(*(engine.runner.run_program(ws, s) for s in specs))
    for i, r in enumerate(results):
        assert (r.exit_code, r.stdout, r.stderr) == (i % 7, f"out-{i}\n", f"err-{i}\n"), r


@pytest.mark.parametrize("profile", [Profile.WORKSPACE_WRITE, Profile.READ_ONLY])
async def test_run_directories_are_as_per_run_mode_makes_them(tmp_path: Path, profile: Profile) -> None:
    """Made by the supervisor where the sandbox may write runs/, by the host where it may not (read-only)."""
    seen = []
    for mode in ("session", "per-run"):
        engine = await _engine(tmp_path, mode, SandboxPolicy(profile=profile))
        try:
            ws = await engine.manager.create_workspace("dirs")
            assert ws.host_path is not None
            r = await engine.runner.run_program(ws, sh('test -d "$RUN_DIR" && echo there'))
            assert r.exit_code == 0 and r.stdout == "there\n", r
            st = os.stat(ws.host_path / r.run_dir)
            seen.append((st.st_mode, st.st_uid == os.stat(ws.host_path / "runs").st_uid))
        finally:
            await engine.aclose()
    assert seen[0] == seen[1] == (seen[0][0], True), seen
