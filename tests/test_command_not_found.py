"""A program that cannot be started is one typed error from the preparation (or the exec) to the caller:
``CommandNotFound`` (127) or ``NotExecutable`` (126), raised by ``start_program`` and ``start_process``, returned
by ``run_program`` as the result a shell would give, on the local backend and the sandbox's modes alike."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import execspace
from execspace import RunProgramSpec
from execspace.backends.local import LocalBackend, LocalOptions
from execspace.backends.sandbox import SandboxBackend, SandboxOptions, SessionConfig, sandbox_of
from execspace.errors import CannotExecute, CommandNotFound, ExecspaceError, NotExecutable
from execspace.models import ResourceLimits
from execspace.registry import probe_backend
from tests.support import make_traversable

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(params=["local", "per-run", "session"])
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[execspace.BaseEngine]:
    mode = request.param
    if mode == "local":
        eng = await LocalBackend.open(LocalOptions(workspace_root=tmp_path / "ws"))
    else:
        probe = await probe_backend("sandbox", mode="session")
        if not probe.ok:
            pytest.skip(f"sandbox unavailable: {probe.reason}")
        make_traversable(tmp_path)
        session = SessionConfig(pool_size=0) if mode == "session" else None
        options = SandboxOptions(workspace_root=tmp_path / mode, mode=mode, session=session)
        eng = await SandboxBackend.open(options)
    try:
        yield eng
    finally:
        await eng.aclose()


async def test_start_program_of_a_missing_bare_name_raises_command_not_found(engine: execspace.BaseEngine) -> None:
    ws = await engine.manager.create_workspace("missing")
    with pytest.raises(CommandNotFound) as caught:
        await engine.runner.start_program(ws, RunProgramSpec("no-such-program-xyz"))
    err = caught.value
    assert isinstance(err, ExecspaceError) and isinstance(err, FileNotFoundError)
    assert err.exit_code == 127 and err.command == "no-such-program-xyz"
    assert str(err).startswith("execspace: command not found: 'no-such-program-xyz' (searched the run's PATH=")
    # its run directory was made before the lookup, as for a run that starts
    assert ws.host_path is not None and (ws.host_path / err.run_dir).is_dir()
    assert await engine.runner.list_programs(ws) == []


async def test_run_program_of_a_missing_bare_name_is_the_127_a_shell_gives(engine: execspace.BaseEngine) -> None:
    ws = await engine.manager.create_workspace("missing-run")
    result = await engine.runner.run_program(ws, RunProgramSpec("no-such-program-xyz"))
    assert result.exit_code == 127
    assert result.stderr.startswith("execspace: command not found: 'no-such-program-xyz'")
    assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1
    assert ws.host_path is not None and (ws.host_path / result.run_dir).is_dir()


async def test_start_program_of_a_file_that_cannot_be_executed_on_the_host(tmp_path: Path) -> None:
    """The local backend finds out at the exec: a file without its x bit is NotExecutable (126), a path that is
    not there CommandNotFound (127), both naming the command."""
    async with execspace.open_engine("local", workspace_root=tmp_path / "ws") as engine:
        ws = await engine.manager.create_workspace("noexec")
        assert ws.host_path is not None
        data = ws.host_path / "work" / "data.txt"  # the run's cwd
        data.write_text("not a program\n")
        os.chmod(data, 0o644)
        cases: list[tuple[str, type[CannotExecute], int]] = [
            ("./data.txt", NotExecutable, 126),
            ("./no-such-program-xyz", CommandNotFound, 127),
        ]
        for cmd, error, code in cases:
            with pytest.raises(error) as caught:
                await engine.runner.start_program(ws, RunProgramSpec(cmd))
            assert caught.value.exit_code == code and cmd in str(caught.value)
            result = await engine.runner.run_program(ws, RunProgramSpec(cmd))
            assert (result.exit_code, result.stderr) == (code, f"{caught.value}\n"), cmd


async def test_a_missing_relative_path_says_it_starts_in_the_workspace(engine: execspace.BaseEngine) -> None:
    """On every mode, ``./tool.sh`` that is not in the run's working directory is a 127 saying where a relative path
    starts (a reader's own ``./script`` is not there) and how to reach the file."""
    ws = await engine.manager.create_workspace("relative-everywhere")
    result = await engine.runner.run_program(ws, RunProgramSpec("./no-such-tool.sh"))
    assert result.exit_code == 127
    assert "in the workspace, not from your current directory" in result.stderr, result.stderr
    assert "give its absolute path" in result.stderr


async def test_a_relative_path_missing_from_the_runs_cwd_says_where_it_looked(tmp_path: Path) -> None:
    """``./tool.sh`` starts from the run's working directory in the workspace, not the caller's: the 127 says so and
    names that directory (not a ``#!`` line to check); a file that is there but whose interpreter is not keeps the
    ``#!`` hint."""
    async with execspace.open_engine("local", workspace_root=tmp_path / "ws") as engine:
        ws = await engine.manager.create_workspace("relative")
        assert ws.host_path is not None
        (tmp_path / "tool.sh").write_text("#!/bin/sh\necho tool\n")  # beside the caller, not in the workspace
        result = await engine.runner.run_program(ws, RunProgramSpec("./tool.sh"))
        assert result.exit_code == 127
        assert f"no such file in the run's working directory {ws.host_path / 'work'}:" in result.stderr
        assert "in the workspace, not from your current directory" in result.stderr and "#!" not in result.stderr
        tool = ws.host_path / "work" / "tool.sh"
        tool.write_text("#!/no/such/interpreter\n")
        tool.chmod(0o755)
        result = await engine.runner.run_program(ws, RunProgramSpec("./tool.sh"))
        assert result.exit_code == 127
        assert "the interpreter on its #! line is missing" in result.stderr, result.stderr


async def test_start_process_of_a_missing_bare_name_raises_command_not_found(tmp_path: Path) -> None:
    probe = await probe_backend("sandbox")
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws") as engine:
        ws = await engine.manager.create_workspace("process")
        with pytest.raises(CommandNotFound) as caught:
            await sandbox_of(engine.runner).start_process(ws, ["no-such-program-xyz"], limits=ResourceLimits())
        assert caught.value.exit_code == 127 and "no-such-program-xyz" in str(caught.value)
