"""The jupyter backend with real ipykernel kernels: state, rich outputs, timeouts, dead kernels."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import execspace
from execspace import (
    BaseEngine,
    CodeBlock,
    CodeExecutionInput,
    CodeExecutor,
    PutFile,
    ResourceLimits,
    SetupFailed,
    Workspace,
)

pytest.importorskip("jupyter_client", reason="needs the jupyter extra (pip install 'execspace[jupyter]')")

from execspace.backends.jupyter import (
    HostKernels,
    JupyterBackend,
    JupyterOptions,
    KernelSessions,
    SandboxedKernels,
)
from execspace.protocols import SupportsKernels
from execspace.registry import probe_backend
from tests.backends.jupyter_support import alive, kernels_of
from tests.support import make_traversable

# the smallest valid GIF (1x1, one colour), built here so that no image library is needed
TINY_GIF = base64.b64decode("R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7")


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[BaseEngine]:
    # no warm pool here: these tests are about one kernel's behaviour, and pooled starts would compete for CPU
    async with execspace.open_engine(
        "jupyter", workspace_root=tmp_path / "ws", interrupt_grace=1.0, mode=HostKernels(pool_size=0)
    ) as eng:
        yield eng


@pytest.fixture
def kernels(engine: BaseEngine) -> KernelSessions:
    return kernels_of(engine)


@pytest.fixture
async def ws(engine: BaseEngine) -> Workspace:
    return await engine.manager.create_workspace("nb/session")


async def test_probe_and_capabilities_are_honest() -> None:
    assert (await probe_backend("jupyter")).ok
    missing = await JupyterBackend.probe(JupyterOptions(kernel_name="no-such-kernel"))
    assert not missing.ok and "no-such-kernel" in missing.reason and "execspace[jupyter]" in missing.fix
    caps = await JupyterBackend.capabilities(mode=HostKernels())
    assert caps.persistent_state and str(caps.isolation) == "none" and not caps.network_control
    assert "python" in caps.languages
    assert caps.kernels is not None and str(caps.kernels.isolation) == "none" and caps.kernels.warm_pool == 1


async def test_capabilities_of_the_default_mode_are_what_an_engine_opened_with_it_says(tmp_path: Path) -> None:
    """What doctor reports (``JupyterBackend.capabilities()``) is what ``open_engine`` gives: sandboxed kernels, or
    no engine at all (the default never falls back to the host)."""
    if not (await probe_backend("jupyter", mode=SandboxedKernels())).ok:
        with pytest.raises(SetupFailed, match="cannot sandbox kernels"):
            await JupyterBackend.capabilities()
        return
    make_traversable(tmp_path)
    stated = await JupyterBackend.capabilities()
    async with execspace.open_engine("jupyter", workspace_root=tmp_path / "ws") as eng:
        opened = eng.describe()
    assert stated.kernels is not None and stated.kernels == opened.kernels
    assert stated.isolation == opened.isolation == "process"
    assert isinstance(eng, SupportsKernels) and isinstance(eng.kernels, KernelSessions)


async def test_state_persists_in_a_workspace(kernels: KernelSessions, ws: Workspace) -> None:
    first = await kernels.execute(ws, "import math\nx = 41\nprint('set')\nx + 1")
    assert first.exit_code == 0 and first.text == "set\n42\n"
    second = await kernels.execute(ws, "print(x * 2, math.pi > 3)")
    assert second.exit_code == 0 and second.text == "82 True\n"


async def test_workspaces_are_isolated_and_kernel_runs_in_work(
    engine: BaseEngine, kernels: KernelSessions, ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXECSPACE_TEST_API_TOKEN", "s3cret-value")  # read when the kernel starts
    other = await engine.manager.create_workspace("nb/other")
    await kernels.execute(ws, "secret_state = 'mine'")
    seen = await kernels.execute(other, "print('secret_state' in globals())")
    assert seen.text == "False\n"
    where = await kernels.execute(
        other, "import os; print(os.getcwd()); print(os.environ.get('EXECSPACE_TEST_API_TOKEN'))"
    )
    assert where.text == f"{other.host_path / 'work'}\nNone\n"


async def test_workspace_file_api_and_kernel_share_files(
    engine: BaseEngine, kernels: KernelSessions, ws: Workspace
) -> None:
    await engine.fs.put_files(ws, [PutFile("work/inputs/data.csv", "a,b\n1,2\n")])
    cell = await kernels.execute(
        ws, "rows = open('inputs/data.csv').read().splitlines()\nopen('../out/n.txt', 'w').write(str(len(rows)))"
    )
    assert cell.exit_code == 0
    files = await engine.fs.collect(ws, ["out/**"])
    assert [(f.name, f.text) for f in files] == [("out/n.txt", "2")]


async def test_matplotlib_plot_comes_back_as_png(engine: BaseEngine, kernels: KernelSessions, ws: Workspace) -> None:
    cell = await kernels.execute(ws, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')")
    assert cell.exit_code == 0, cell.text
    pngs = [f for f in cell.files if f.endswith(".png")]
    assert len(pngs) == 1 and pngs[0].startswith("out/cell-")
    png = (await engine.fs.read_file(ws, pngs[0])).content
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
    assert f"[saved {pngs[0]}]" in cell.text


async def test_rich_outputs_become_files_with_stable_names(
    engine: BaseEngine, kernels: KernelSessions, ws: Workspace
) -> None:
    code = f"""
from IPython.display import HTML, SVG, Latex, Markdown, JSON, Image, display
display(HTML('<b>bold</b>'))
display(SVG('<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>'))
display(Latex(r'$\\alpha$'))
display(Markdown('# title'))
display(JSON({{'k': [1, 2]}}))
display(Image(data={TINY_GIF!r}, format='gif'))
print('after')
"""
    await kernels.execute(ws, "pass")  # cell 1: names below belong to cell 2
    cell = await kernels.execute(ws, code)
    assert cell.exit_code == 0, cell.text
    expected = {
        "out/cell-2-1.html": b"<b>bold</b>",
        "out/cell-2-2.svg": b'<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>',
        "out/cell-2-3.tex": b"$\\alpha$",
        "out/cell-2-4.md": b"# title",
    }
    assert set(cell.files) == {*expected, "out/cell-2-5.json", "out/cell-2-6.gif"}
    for name, content in expected.items():
        assert (await engine.fs.read_file(ws, name)).content == content
    assert (await engine.fs.read_file(ws, "out/cell-2-6.gif")).content == TINY_GIF
    assert b'"k"' in (await engine.fs.read_file(ws, "out/cell-2-5.json")).content
    assert cell.text.endswith("after\n")


async def test_error_gives_name_value_and_plain_traceback(kernels: KernelSessions, ws: Workspace) -> None:
    cell = await kernels.execute(ws, "def f():\n    raise ValueError('bad thing')\nprint('before')\nf()")
    assert cell.exit_code == 1 and cell.error == ("ValueError", "bad thing")
    assert "\x1b[" not in cell.text
    assert cell.text.startswith("before\n") and "raise ValueError('bad thing')" in cell.text


async def test_input_fails_clearly_instead_of_hanging(kernels: KernelSessions, ws: Workspace) -> None:
    started = time.monotonic()
    cell = await kernels.execute(ws, "name = input('name? ')", timeout=20)
    assert time.monotonic() - started < 5 and not cell.timed_out
    assert cell.error is not None and cell.error[0] == "StdinNotImplementedError"
    assert "input() is not available" in cell.text


async def test_infinite_loop_is_interrupted_and_state_kept(kernels: KernelSessions, ws: Workspace) -> None:
    await kernels.execute(ws, "kept = 7")
    started = time.monotonic()
    cell = await kernels.execute(ws, "while True:\n    pass", timeout=1.0)
    assert time.monotonic() - started < 2.5
    assert cell.timed_out and not cell.state_lost and "KeyboardInterrupt" in cell.text
    assert (await kernels.execute(ws, "print(kept)")).text == "7\n"


@pytest.mark.slow
async def test_kernel_ignoring_interrupt_is_restarted(kernels: KernelSessions, ws: Workspace) -> None:
    await kernels.execute(ws, "kept = 7")
    code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
    started = time.monotonic()
    cell = await kernels.execute(ws, code, timeout=1.0)
    assert time.monotonic() - started < 5
    assert cell.timed_out and cell.state_lost and "restarted" in cell.text
    after = await kernels.execute(ws, "print('kept' in globals())")
    assert after.state_lost and "previous one was restarted" in after.text and after.text.endswith("False\n")


@pytest.mark.parametrize(
    ("code", "how", "status"),
    [
        ("import os\nos._exit(3)", "exit code 3", 3),
        ("import ctypes\nctypes.string_at(0)", "killed by signal 11", -11),
    ],
)
async def test_dead_kernel_is_reported_and_replaced(
    kernels: KernelSessions, ws: Workspace, code: str, how: str, status: int
) -> None:
    pid = int((await kernels.execute(ws, "import os\nkept = 1\nprint(os.getpid())")).text)
    # zmq sends from its own thread: output printed just before a hard exit may never leave the kernel
    cell = await kernels.execute(
        ws, f"print('last words', flush=True)\nimport time\ntime.sleep(0.3)\n{code}", timeout=20
    )
    assert cell.kernel_died and cell.state_lost and not cell.timed_out and cell.exit_code == status
    assert how in cell.text and "last words" in cell.text
    assert re.search(r"died during this cell \(\d+\.\d s after this cell was sent\)", cell.text), cell.text
    after = await kernels.execute(ws, "import os\nprint(os.getpid(), 'kept' in globals())")
    assert "previous one died" in after.text
    new_pid, kept = after.text.splitlines()[-1].split()
    assert int(new_pid) != pid and kept == "False"


async def test_kernel_killed_between_calls_is_replaced(kernels: KernelSessions, ws: Workspace) -> None:
    pid = int((await kernels.execute(ws, "import os\nkept = 1\nprint(os.getpid())")).text)
    os.kill(pid, signal.SIGKILL)  # as the OOM killer would, while the kernel is idle
    await asyncio.sleep(0.3)  # "between calls": the kill has landed before the next one
    after = await kernels.execute(ws, "print('kept' in globals())")
    assert after.state_lost and "died between calls (killed by signal 9)" in after.text
    assert after.text.endswith("False\n")


async def test_cancelled_call_interrupts_its_cell(kernels: KernelSessions, ws: Workspace) -> None:
    await kernels.execute(ws, "kept = 7")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(kernels.execute(ws, "while True:\n    pass", timeout=None), 1.0)
    started = time.monotonic()
    after = await kernels.execute(ws, "print(kept)", timeout=10)
    assert after.text == "7\n" and time.monotonic() - started < 3


async def test_output_flood_is_capped(kernels: KernelSessions, ws: Workspace) -> None:
    cell = await kernels.execute(
        ws, "for i in range(20000):\n    print('x' * 99)\nprint('END')", output_bytes=10_000, timeout=30
    )
    assert cell.exit_code == 0 and cell.truncated
    assert len(cell.text.encode()) < 11_000 and "bytes omitted" in cell.text and cell.text.endswith("END\n")


async def test_cleanup_and_close_stop_kernels(tmp_path: Path) -> None:
    async with execspace.open_engine("jupyter", workspace_root=tmp_path / "ws", mode=HostKernels(pool_size=0)) as eng:
        ks: KernelSessions = eng.kernels
        a = await eng.manager.create_workspace("a")
        b = await eng.manager.create_workspace("b")
        pid_a = int((await ks.execute(a, "import os; print(os.getpid())")).text)
        spawn = "import subprocess; print(subprocess.Popen(['sleep', '300']).pid)"
        child_a = int((await ks.execute(a, spawn)).text)
        pid_b = int((await ks.execute(b, "import os; print(os.getpid())")).text)
        await eng.manager.cleanup(a)
        assert not alive(pid_a) and not alive(child_a) and alive(pid_b)
    assert not alive(pid_b)


async def test_code_executor_runs_python_in_the_kernel(tmp_path: Path) -> None:
    make_traversable(tmp_path)  # the default engine sandboxes its kernels and programs where it can
    async with execspace.code_executor("jupyter", workspace_root=tmp_path / "ws", timeout=20) as ex:
        first = await ex.execute_code(
            CodeExecutionInput(
                [
                    CodeBlock("python", "import matplotlib.pyplot as plt\ntotal = 40\nplt.plot([1, 2])"),
                    CodeBlock("bash", "echo from-bash; echo $$ > pid.txt"),
                ],
                execution_id="chat-1",
            )
        )
        assert first.ok, first.output
        assert "from-bash" in first.output
        # output 1 of cell 1 is the repr of plt.plot's return value, output 2 the figure
        assert [f.name for f in first.output_files if f.name.endswith(".png")] == ["out/cell-1-2.png"]
        second = await ex.execute_code(CodeExecutionInput([CodeBlock("py", "total + 2")], execution_id="chat-1"))
        assert second.output == "42\n" and second.ok
        fresh = await ex.execute_code(CodeExecutionInput([CodeBlock("python", "'total' in globals()")]))
        assert fresh.output == "False\n"


async def test_kernel_refuses_limits_it_cannot_enforce(engine: BaseEngine) -> None:
    ex = CodeExecutor(engine, timeout=20, limits=ResourceLimits(memory_bytes=512 * 1024 * 1024))
    result = await ex.execute_code(CodeExecutionInput([CodeBlock("python", "print('ran')")]))
    assert not result.ok and "ran" not in result.output
    assert result.blocks[0].error is not None and "memory_bytes" in result.blocks[0].error


# -- warm pool ---------------------------------------------------------------------------

PROBE_CELL = """
import os, sys, tempfile
print(os.getpid())
print(os.getcwd())
print(tempfile.gettempdir())
print(sorted(os.environ.items()))
print(sys.path)
print(_dh)
"""


def pooled_pids(ks: KernelSessions) -> set[int]:
    assert ks.pool is not None
    return {k.proc.pid for k in ks.pool.idle_kernels()}


async def test_pooled_kernel_serves_first_cell_bound_to_its_workspace(
    tmp_path: Path, kernels: KernelSessions, ws: Workspace
) -> None:
    names = "print(sorted(k for k in globals() if k[0] != '_'))\nprint(__import__('os').getpid())"
    cold_names = (await kernels.execute(ws, names)).text.splitlines()[0]
    async with execspace.open_engine(
        "jupyter", workspace_root=tmp_path / "pooled", mode=HostKernels(pool_size=1)
    ) as eng:
        ks: KernelSessions = eng.kernels
        assert ks.pool is not None and await ks.pool.wait_ready()
        (pid,) = pooled_pids(ks)
        staging = [p for p in (tmp_path / "pooled" / ".kernel-pool").iterdir()]
        new = await eng.manager.create_workspace("fresh")
        assert new.host_path is not None
        first_names, first_pid = (await ks.execute(new, names)).text.splitlines()
        assert int(first_pid) == pid and first_names == cold_names  # the pooled kernel, no names left by binding
        got_pid, cwd, tmp, env, path, dh = (await ks.execute(new, PROBE_CELL)).text.splitlines()
        assert int(got_pid) == pid
        root = str(new.host_path)
        assert cwd == f"{root}/work" and tmp == f"{root}/tmp" and dh == repr([f"{root}/work"])
        assert f"('HOME', '{root}/home')" in env and f"('WORK_DIR', '{root}/work')" in env
        assert ".kernel-pool" not in env + path + dh  # nothing from the staging start is left
        assert staging and not any(p.exists() for p in staging)
        logs = list(new.host_path.glob("runs/kernel-*/kernel.log"))
        assert len(logs) == 1 and (await ks.execute(new, "1+1")).text == "2\n"
        plot = await ks.execute(new, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])")
        assert [f for f in plot.files if f.endswith(".png")], plot.text  # binding kept the inline backend


async def test_two_sessions_never_share_a_pooled_kernel(tmp_path: Path) -> None:
    async with execspace.open_engine("jupyter", workspace_root=tmp_path / "ws", mode=HostKernels(pool_size=2)) as eng:
        ks: KernelSessions = eng.kernels
        assert ks.pool is not None and await ks.pool.wait_ready()
        pids = pooled_pids(ks)
        a, b = [await eng.manager.create_workspace(name) for name in ("a", "b")]
        cell = "import os\nsecret = os.getcwd()\nprint(os.getpid())"
        pid_a, pid_b = [int(r.text) for r in await asyncio.gather(ks.execute(a, cell), ks.execute(b, cell))]
        assert pid_a != pid_b and {pid_a, pid_b} == pids
        assert (await ks.execute(b, "print(secret)")).text == f"{b.host_path / 'work'}\n"
        assert pid_a not in pooled_pids(ks) and pid_b not in pooled_pids(ks)


async def test_idle_pooled_kernels_are_stopped_and_the_pool_refills_on_demand(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    async with execspace.open_engine(
        "jupyter", workspace_root=root, mode=HostKernels(pool_size=1, pool_idle_timeout=0.5)
    ) as eng:
        ks: KernelSessions = eng.kernels
        assert ks.pool is not None and await ks.pool.wait_ready()
        (pid,) = pooled_pids(ks)
        for _ in range(100):
            if not alive(pid) and not list((root / ".kernel-pool").iterdir()):
                break
            await asyncio.sleep(0.1)
        assert not alive(pid) and ks.pool.idle_kernels() == [] and not list((root / ".kernel-pool").iterdir())
        # the refill below must not be reaped before it is looked at (0.5 s pass quickly on a loaded machine)
        ks.pool.idle_timeout = None
        ws = await eng.manager.create_workspace("late")
        assert (await ks.execute(ws, "1+1")).text == "2\n"  # a cold start; it asks the pool to refill
        assert await ks.pool.wait_ready()
        (refilled,) = pooled_pids(ks)
        assert refilled != pid and alive(refilled)
    assert not alive(refilled) and not (root / ".kernel-pool").exists()
