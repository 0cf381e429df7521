"""Errors that once misled (issue 12, point 10): each says what happened in the program's terms and what to do."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import execspace
from execspace import (
    CodeBlock,
    CodeExecutionInput,
    CodeExecutor,
    InvalidSpec,
    RunProgramSpec,
    SetupFailed,
    WorkspaceNotFound,
)
from execspace.backends.sandbox import SandboxPolicy
from execspace.registry import probe_backend
from tests.support import make_traversable


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


async def test_autogen_argument_order_is_named_when_the_block_cannot_run_and_any_fence_tag_kept(
    tmp_path: Path,
) -> None:
    swapped = CodeBlock("print(1)", "python")
    assert swapped.swap_hint() is not None and "CodeBlock(language='python'" in swapped.swap_hint()  # type: ignore[operator]
    async with execspace.open_engine("local", workspace_root=tmp_path) as engine:
        result = await CodeExecutor(engine).execute_code(CodeExecutionInput([swapped]))
    (block,) = result.blocks
    assert block.exit_code != 0 and block.error is not None
    assert re.search(r"not supported.*swapped.*CodeBlock\(language='python'", block.error), block.error
    assert CodeBlock("python title=x", "1").language == "python title=x"  # a model's fence is kept as it came
    assert CodeBlock("", "echo untagged").language == ""
    assert CodeBlock("0", "JAVASCRIPT").code == "JAVASCRIPT"  # a model's block may hold a language's name


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


@pytest.mark.asyncio
async def test_a_program_linking_outside_the_sandbox_says_where_and_how_to_grant_it(tmp_path: Path) -> None:
    """A venv's bin/python is a link to the Python it was made from, which the sandbox may not show (point 9)."""
    if not (await probe_backend("sandbox")).ok:
        pytest.skip("no working sandbox here")
    make_traversable(tmp_path)
    open_dir = tmp_path
    (open_dir / "install").mkdir()
    real = open_dir / "install" / "python3"
    shutil.copy("/bin/true", real)
    (open_dir / "env" / "bin").mkdir(parents=True)
    (open_dir / "env" / "bin" / "python").symlink_to(real)
    async with execspace.open_engine(
        "sandbox", workspace_root=tmp_path / "ws", policy=SandboxPolicy(read_paths=(str(open_dir / "env"),))
    ) as eng:
        ws = await eng.manager.create_workspace("v")
        r = await eng.runner.run_program(ws, RunProgramSpec(str(open_dir / "env" / "bin" / "python")))
        missing = await eng.runner.run_program(ws, RunProgramSpec("/no/such/program"))
    assert r.exit_code == 127
    assert r.stderr.startswith("execspace: cannot execute") and "bwrap" not in r.stderr, r.stderr
    assert f"is a link to {real}" in r.stderr and f"--read {open_dir}" in r.stderr
    assert missing.exit_code == 127 and "(nor is it on this host)" in missing.stderr


@pytest.mark.asyncio
async def test_a_grant_under_a_directory_the_sandbox_uid_cannot_pass_is_reachable(tmp_path: Path) -> None:
    """As root the sandbox runs as another uid, which cannot pass a 0700 directory: the grant is shown from a clone
    of its mount (backends/sandbox/grants.py) instead of refused, as it once was ("cannot pass")."""
    if os.geteuid() != 0:
        pytest.skip("only root's sandbox runs as another uid")
    if not (await probe_backend("sandbox")).ok:
        pytest.skip("no working sandbox here")
    make_traversable(tmp_path)
    private = tmp_path / "private"
    (private / "env").mkdir(parents=True)
    (private / "env" / "lib.py").write_text("X = 1\n")
    private.chmod(0o700)
    async with execspace.open_engine(
        "sandbox", workspace_root=tmp_path / "ws", policy=SandboxPolicy(read_paths=(str(private / "env"),))
    ) as eng:
        ws = await eng.manager.create_workspace("g")
        r = await eng.runner.run_program(ws, RunProgramSpec("cat", [str(private / "env" / "lib.py")]))
    assert (r.exit_code, r.stdout) == (0, "X = 1\n"), r.stderr


def test_the_cli_shows_why_a_program_could_not_start_in_the_sandbox() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "execspace", "run", "--backend", "sandbox", "--", "/no/such/program"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    if r.returncode == 125 and "not usable here" in r.stderr:
        pytest.skip("no working sandbox here")
    assert r.returncode == 127
    assert "execspace: cannot execute '/no/such/program' in the sandbox: No such file or directory" in r.stderr


@pytest.mark.asyncio
async def test_a_workspace_root_the_sandbox_uid_cannot_pass_is_refused_with_the_fix(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root's sandbox runs as another uid")
    if not (await probe_backend("sandbox")).ok:
        pytest.skip("no working sandbox here")
    tmp_path.chmod(0o700)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws") as eng:
        ws = await eng.manager.create_workspace("w")
        with pytest.raises(SetupFailed, match=r"cannot pass .* on the way to the workspace.*chmod o\+x"):
            await eng.runner.run_program(ws, RunProgramSpec("true"))


@pytest.mark.asyncio
async def test_program_binds_show_a_workspace_directory_at_another_path_and_refuse_what_would_shadow(
    tmp_path: Path,
) -> None:
    bad_binds = (
        (("/usr/x", "work"),),
        (("relative", "work"),),
        (("/home/user", "../up"),),
        (("/tmp/x", "work"),),
        (("/home/user/", "work"),),
    )
    for bad in bad_binds:
        with pytest.raises(InvalidSpec, match="program_binds"):
            async with execspace.open_engine("sandbox", program_binds=bad):
                pass
    if not (await probe_backend("sandbox")).ok:
        pytest.skip("no working sandbox here")
    make_traversable(tmp_path)
    async with execspace.open_engine(
        "sandbox", workspace_root=tmp_path / "ws", program_binds=(("/home/user", "work"),)
    ) as eng:
        ws = await eng.manager.create_workspace("l")
        # the file API takes the bound path as the program sees it; any other absolute path is the sandbox's
        await eng.fs.put_files(ws, [execspace.PutFile("/home/user/d.txt", "via the bind")])
        with pytest.raises(FileNotFoundError, match=r"as the sandbox's programs see /home/x"):
            await eng.fs.read_file(ws, "/home/x")
        r = await eng.runner.run_program(
            ws, RunProgramSpec("sh", ["-c", "test -L /home/user || pwd; cat d.txt"], cwd="/home/user")
        )
        assert (await eng.fs.read_file(ws, "work/d.txt")).content == b"via the bind"
    assert r.stdout == "/home/user\nvia the bind", r.stderr
