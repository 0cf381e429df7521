"""AutoGen's CodeExecutor interface, with autogen_core's own CodeBlock and CancellationToken, on the sandbox."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("autogen_core", reason="needs the autogen extra (pip install 'execspace[autogen]')")

from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock, CodeExecutor

import execspace
from execspace import BaseEngine, CapabilityError, UsageError, WorkspaceNotFound
from execspace.integrations.autogen import TIMEOUT_EXIT_CODE, ExecspaceCodeExecutor
from execspace.testing.processes import new_tag, wait_no_process, wait_processes

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox backend here is bubblewrap")


@pytest.fixture
async def executor(engine: BaseEngine) -> AsyncIterator[ExecspaceCodeExecutor]:
    async with ExecspaceCodeExecutor(engine, workspace_id="autogen/test", timeout=5) as ex:
        yield ex


async def test_python_and_bash_blocks_share_one_workspace(executor: ExecspaceCodeExecutor) -> None:
    assert isinstance(executor, CodeExecutor)
    blocks = [
        CodeBlock(code="open('numbers.txt', 'w').write('6 7')\nprint('python wrote')", language="python"),
        CodeBlock(code="read a b < numbers.txt; echo $((a * b)) | tee ../out/answer.txt", language="bash"),
    ]
    result = await executor.execute_code_blocks(blocks, CancellationToken())
    assert result.exit_code == 0
    assert result.output.startswith("python wrote\n42\n")
    assert [(f.name, f.content) for f in result.files] == [("out/answer.txt", b"42\n")]

    again = await executor.execute_code_blocks([CodeBlock("cat numbers.txt", "sh")], CancellationToken())
    assert (again.exit_code, again.output) == (0, "6 7\n")


async def test_the_first_failing_block_ends_the_call(executor: ExecspaceCodeExecutor) -> None:
    blocks = [
        CodeBlock("import sys; print('before'); sys.exit(3)", "python"),
        CodeBlock("touch never.txt", "bash"),
    ]
    result = await executor.execute_code_blocks(blocks, CancellationToken())
    assert result.exit_code == 3 and "before" in result.output
    assert executor.workspace.host_path is not None
    assert not (executor.workspace.host_path / "work/never.txt").exists()

    unknown = await executor.execute_code_blocks([CodeBlock("x", "cobol")], CancellationToken())
    assert unknown.exit_code != 0 and "cobol" in unknown.output


async def test_a_timeout_is_exit_code_124_and_kills_the_block(engine: BaseEngine) -> None:
    tag = new_tag("autogen")
    async with ExecspaceCodeExecutor(engine, timeout=0.5) as ex:
        sleeper = f"python3 -c 'import time; time.sleep(30)' {tag}"
        result = await ex.execute_code_blocks([CodeBlock(sleeper, "bash")], CancellationToken())
        assert result.exit_code == TIMEOUT_EXIT_CODE and "timed out" in result.output
        assert wait_no_process(tag) == []


async def test_cancellation_kills_the_block_and_runs_nothing_after(executor: ExecspaceCodeExecutor) -> None:
    tag = new_tag("autogen")
    token = CancellationToken()
    sleeper = f"python3 -c 'import time; time.sleep(30)' {tag}"  # the tag in its command line
    blocks = [CodeBlock(sleeper, "bash"), CodeBlock("touch after.txt", "bash")]
    call = asyncio.ensure_future(executor.execute_code_blocks(blocks, token))
    await wait_processes(tag, at_least=1)
    token.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert wait_no_process(tag) == []
    assert executor.workspace.host_path is not None
    assert not (executor.workspace.host_path / "work/after.txt").exists()

    with pytest.raises(asyncio.CancelledError):  # a token cancelled before the call runs nothing
        await executor.execute_code_blocks([CodeBlock("touch after.txt", "bash")], token)
    assert not (executor.workspace.host_path / "work/after.txt").exists()


async def test_restart_gives_a_fresh_workspace_and_stop_removes_it(
    executor: ExecspaceCodeExecutor, engine: BaseEngine
) -> None:
    await executor.execute_code_blocks([CodeBlock("echo kept > state.txt", "bash")], CancellationToken())
    await executor.restart()
    result = await executor.execute_code_blocks([CodeBlock("cat state.txt", "bash")], CancellationToken())
    assert result.exit_code != 0 and "No such file" in result.output

    host_path = executor.workspace.host_path
    await executor.stop()
    assert host_path is not None and not host_path.exists()
    with pytest.raises(WorkspaceNotFound):
        await engine.manager.get_workspace("autogen/test")
    with pytest.raises(UsageError, match="start"):
        await executor.execute_code_blocks([CodeBlock("true", "bash")], CancellationToken())


async def test_limits_the_engine_cannot_enforce_are_refused_up_front(tmp_path: Path) -> None:
    async with execspace.open_engine("local", workspace_root=tmp_path / "local") as local:
        with pytest.raises(CapabilityError):
            ExecspaceCodeExecutor(local, limits=execspace.ResourceLimits(pids=10))


def test_a_missing_autogen_names_the_extra() -> None:
    script = (
        "import sys, execspace\n"
        "assert 'autogen_core' not in sys.modules\n"
        "sys.modules['autogen_core'] = None\n"
        "try:\n"
        "    import execspace.integrations.autogen\n"
        "except execspace.integrations.MissingExtra as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert "pip install 'execspace[autogen]'" in out
