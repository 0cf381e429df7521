"""Errors that once misled (issue 12, point 10): each says what happened in the program's terms and what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

import execspace
from execspace import CodeBlock, InvalidSpec, RunProgramSpec, WorkspaceNotFound
from execspace.registry import probe_backend


@pytest.mark.asyncio
async def test_a_command_line_as_cmd_says_how_to_split_it(tmp_path: Path) -> None:
    async with execspace.open_engine("local", workspace_root=tmp_path) as engine:
        ws = await engine.manager.create_workspace("e")
        r = await engine.runner.run_program(ws, RunProgramSpec("python3 -c 'print(1)'"))
    assert r.exit_code == 127
    assert "RunProgramSpec('python3', ['-c', 'print(1)'])" in r.stderr and "RunProgramSpec('sh', ['-c'," in r.stderr


@pytest.mark.asyncio
async def test_not_found_in_the_sandbox_names_the_path_the_sandbox_searched(tmp_path: Path) -> None:
    if not (await probe_backend("sandbox")).ok:
        pytest.skip("no working sandbox here")
    async with execspace.open_engine("sandbox", workspace_root=tmp_path) as engine:
        ws = await engine.manager.create_workspace("e")
        r = await engine.runner.run_program(ws, RunProgramSpec("no-such-tool", env={"PATH": "/root/bin:/usr/bin"}))
    assert r.exit_code == 127
    assert "searched the run's PATH=/usr/bin)" in r.stderr, r.stderr  # /root is not in the sandbox


@pytest.mark.asyncio
async def test_running_in_a_cleaned_up_workspace_is_workspace_not_found(tmp_path: Path) -> None:
    async with execspace.open_engine("local", workspace_root=tmp_path) as engine:
        ws = await engine.manager.create_workspace("gone")
        await engine.manager.cleanup(ws)
        with pytest.raises(WorkspaceNotFound, match=r"cleaned up.*create_workspace"):
            await engine.runner.run_program(ws, RunProgramSpec("true"))


def test_autogen_argument_order_is_caught_and_any_fence_tag_kept() -> None:
    with pytest.raises(InvalidSpec, match=r"swapped.*CodeBlock\(language='python'"):
        CodeBlock("print(1)", "python")
    assert CodeBlock("python title=x", "1").language == "python title=x"  # a model's fence is kept as it came
    assert CodeBlock("", "echo untagged").language == ""


def test_an_absolute_input_destination_is_named_as_the_destination(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    (tmp_path / "data.csv").write_text("a\n")
    proc = subprocess.run(
        [sys.executable, "-m", "execspace", "run", "--backend", "local", "--input", "data.csv:/etc/x", "--", "true"],
        cwd=tmp_path,
        capture_output=True,
        env={**os.environ, "EXECSPACE_DAEMON": "off"},
        timeout=60,
    )
    assert proc.returncode == 125
    assert b"DEST is a path in the workspace" in proc.stderr and b"--input data.csv:work/x" in proc.stderr
    assert b"does not exist" not in proc.stderr  # it once read the DEST as part of the SRC
