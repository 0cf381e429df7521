"""Remote mode against real servers started here: a Jupyter Server (one per module), a Kernel Gateway, an https one.

The kernels run ipykernel on this host; the engine talks to them only through the server's REST and
WebSocket API, as it would to a server elsewhere that shares the workspace directories.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from itertools import count
from pathlib import Path

import pytest
import pytest_asyncio

pytest.importorskip("jupyter_client", reason="needs the jupyter extra (pip install 'execspace[jupyter]')")

from execspace import (
    BaseEngine,
    CodeBlock,
    CodeExecutionInput,
    CodeExecutor,
    PutFile,
    RunProgramSpec,
    Workspace,
    open_engine,
)
from execspace.backends.jupyter import JupyterBackend, JupyterOptions, ServerKernels
from execspace.backends.jupyter.remote_server import LocalServer, start_local_server
from execspace.backends.jupyter.serverapi import ServerApi
from execspace.backends.jupyter.serverkernels import RemoteKernelSessions
from execspace.errors import BackendError, CapabilityError, InvalidSpec, SetupFailed
from tests.backends.jupyter_support import alive, wait_dead

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(importlib.util.find_spec("jupyter_server") is None, reason="jupyter_server is not installed"),
]

_engines = count()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalServer]:
    async with start_local_server(tmp_path_factory.mktemp("jroot")) as srv:
        yield srv


@pytest_asyncio.fixture(loop_scope="module")
async def engine(server: LocalServer) -> AsyncIterator[BaseEngine]:
    # workspaces under the server's root, so kernels also start in work/ through the sessions API's path
    async with open_engine(
        "jupyter",
        workspace_root=server.root_dir / f"ws{next(_engines)}",
        interrupt_grace=1.0,
        mode=ServerKernels(url=server.url, token=server.token, server_root=server.root_dir),
    ) as eng:
        yield eng


@pytest.fixture
def kernels(engine: BaseEngine) -> RemoteKernelSessions:
    ks = engine.kernels
    assert isinstance(ks, RemoteKernelSessions)
    return ks


@pytest_asyncio.fixture(loop_scope="module")
async def ws(engine: BaseEngine) -> Workspace:
    return await engine.manager.create_workspace("nb/session")


async def test_state_persists_and_kernel_is_moved_into_its_workspace(
    kernels: RemoteKernelSessions, ws: Workspace
) -> None:
    first = await kernels.execute(ws, "import math\nx = 41\nprint('set')\nx + 1")
    assert first.exit_code == 0 and first.text == "set\n42\n"
    second = await kernels.execute(
        ws, "import os\nprint(x * 2, math.pi > 3)\nprint(os.getcwd())\nprint(os.environ['HOME'])"
    )
    assert second.exit_code == 0
    assert second.text == f"82 True\n{ws.host_path / 'work'}\n{ws.host_path / 'home'}\n"


async def test_server_is_locked_down(server: LocalServer, kernels: RemoteKernelSessions, ws: Workspace) -> None:
    assert server.url.startswith("http://127.0.0.1:") and len(server.token) >= 43
    api = ServerApi(server.url, "")
    try:
        assert await api.status_without_token() == 403
    finally:
        api.close()
    # the token is in neither the server's argv (readable by every user) nor any kernel's environment
    assert server.token not in Path(f"/proc/{server.pid}/cmdline").read_text()
    cell = await kernels.execute(ws, "import os\nprint(open(f'/proc/{os.getpid()}/environ').read())")
    assert cell.exit_code == 0 and server.token not in cell.text


async def test_matplotlib_plot_comes_back_as_png(
    engine: BaseEngine, kernels: RemoteKernelSessions, ws: Workspace
) -> None:
    cell = await kernels.execute(ws, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')", timeout=60)
    assert cell.exit_code == 0, cell.text
    pngs = [f for f in cell.files if f.endswith(".png")]
    assert len(pngs) == 1 and pngs[0].startswith("out/cell-")
    png = (await engine.fs.read_file(ws, pngs[0])).content
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
    assert f"[saved {pngs[0]}]" in cell.text


async def test_error_gives_name_value_and_plain_traceback(kernels: RemoteKernelSessions, ws: Workspace) -> None:
    cell = await kernels.execute(ws, "def f():\n    raise ValueError('bad thing')\nprint('before')\nf()")
    assert cell.exit_code == 1 and cell.error == ("ValueError", "bad thing")
    assert "\x1b[" not in cell.text
    assert cell.text.startswith("before\n") and "raise ValueError('bad thing')" in cell.text


async def test_infinite_loop_is_interrupted_within_the_timeout(kernels: RemoteKernelSessions, ws: Workspace) -> None:
    await kernels.execute(ws, "kept = 7")
    started = time.monotonic()
    cell = await kernels.execute(ws, "while True:\n    pass", timeout=1.0)
    assert time.monotonic() - started < 2.5
    assert cell.timed_out and not cell.state_lost and "KeyboardInterrupt" in cell.text
    assert (await kernels.execute(ws, "print(kept)")).text == "7\n"


@pytest.mark.slow
async def test_kernel_ignoring_interrupt_is_replaced(kernels: RemoteKernelSessions, ws: Workspace) -> None:
    pid = int((await kernels.execute(ws, "import os\nkept = 7\nprint(os.getpid())")).text)
    code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
    cell = await kernels.execute(ws, code, timeout=1.0)
    assert cell.timed_out and cell.state_lost and cell.exit_code == -9 and "replaced by a fresh one" in cell.text
    assert await wait_dead(pid)  # DELETE on the server stopped the spinning kernel
    after = await kernels.execute(ws, "print('kept' in globals())")
    assert after.state_lost and "previous one was restarted" in after.text and after.text.endswith("False\n")


async def test_kernel_killed_mid_run_is_reported_and_replaced(kernels: RemoteKernelSessions, ws: Workspace) -> None:
    pid = int((await kernels.execute(ws, "import os\nkept = 1\nprint(os.getpid())")).text)
    cell = await kernels.execute(ws, "print('last words', flush=True)\nimport os, time\ntime.sleep(0.3)\nos._exit(3)")
    assert cell.kernel_died and cell.state_lost and not cell.timed_out
    assert "died during this cell" in cell.text and "last words" in cell.text
    after = await kernels.execute(ws, "import os\nprint(os.getpid(), 'kept' in globals())")
    assert after.state_lost and "previous one died" in after.text
    new_pid, kept = after.text.splitlines()[-1].split()
    assert int(new_pid) != pid and kept == "False"


@pytest.mark.slow
async def test_kernel_killed_between_calls_is_replaced(kernels: RemoteKernelSessions, ws: Workspace) -> None:
    pid = int((await kernels.execute(ws, "import os\nkept = 1\nprint(os.getpid())")).text)
    os.kill(pid, signal.SIGKILL)  # as the OOM killer would, while the kernel is idle
    await asyncio.sleep(2.5)  # the server's restarter (polling every second) notices and tells us
    after = await kernels.execute(ws, "print('kept' in globals())")
    assert after.state_lost and "died between calls" in after.text and after.text.endswith("False\n")


async def test_two_workspaces_are_isolated(engine: BaseEngine, kernels: RemoteKernelSessions, ws: Workspace) -> None:
    other = await engine.manager.create_workspace("nb/other")
    await kernels.execute(ws, "secret_state = 'mine'")
    seen = await kernels.execute(other, "import os\nprint('secret_state' in globals(), os.getcwd())")
    assert seen.text == f"False {other.host_path / 'work'}\n"


async def test_file_api_round_trips_through_the_kernel(
    engine: BaseEngine, kernels: RemoteKernelSessions, ws: Workspace
) -> None:
    await engine.fs.put_files(ws, [PutFile("work/inputs/data.csv", "a,b\n1,2\n3,4\n")])
    cell = await kernels.execute(
        ws, "rows = open('inputs/data.csv').read().splitlines()\nopen('../out/n.txt', 'w').write(str(len(rows)))"
    )
    assert cell.exit_code == 0, cell.text
    files = await engine.fs.collect(ws, ["out/**"])
    assert [(f.name, f.text) for f in files] == [("out/n.txt", "3")]


async def test_cleanup_and_close_delete_kernels_on_the_server(server: LocalServer) -> None:
    eng = await JupyterBackend.open(
        JupyterOptions(
            workspace_root=server.root_dir / f"ws{next(_engines)}",
            mode=ServerKernels(url=server.url, token=server.token),
        )
    )
    async with eng:
        ks: RemoteKernelSessions = eng.kernels
        a = await eng.manager.create_workspace("a")
        b = await eng.manager.create_workspace("b")
        pid_a = int((await ks.execute(a, "import os; print(os.getpid())")).text)
        pid_b = int((await ks.execute(b, "import os; print(os.getpid())")).text)
        await eng.manager.cleanup(a)
        assert await wait_dead(pid_a) and alive(pid_b)
    assert await wait_dead(pid_b)


async def test_code_executor_runs_python_in_the_remote_kernel(engine: BaseEngine) -> None:
    ex = CodeExecutor(engine, timeout=30)
    blocks = [CodeBlock("python", "total = 40\nimport os\nprint(os.getpid())"), CodeBlock("bash", "echo $$")]
    first = await ex.execute_code(CodeExecutionInput(blocks, execution_id="chat-1"))
    assert first.ok, first.output
    kernel_pid, bash_pid = (int(line) for line in first.output.split())
    assert kernel_pid != bash_pid
    second = await ex.execute_code(CodeExecutionInput([CodeBlock("py", "total + 2")], execution_id="chat-1"))
    assert second.ok and second.output == "42\n"
    caps = engine.describe()
    # programs run on this host (isolation none); the kernels are the server's
    assert caps.persistent_state and "remote kernels on" in caps.details["mode"] and str(caps.isolation) == "none"
    assert caps.kernels is not None and str(caps.kernels.isolation) == "remote"
    assert (
        caps.kernels.cell_limits == {"timeout", "output_bytes"} and caps.as_dict()["kernels"]["isolation"] == "remote"
    )


async def test_wrong_token_is_refused_clearly(server: LocalServer, tmp_path: Path) -> None:
    with pytest.raises(SetupFailed, match=r"refused the token \(HTTP 403") as info:
        await JupyterBackend.open(
            JupyterOptions(
                workspace_root=tmp_path / "ws", mode=ServerKernels(url=server.url, token="not-" + server.token)
            )
        )
    assert "not-" not in str(info.value)  # the error never echoes a token
    with pytest.raises(SetupFailed, match="needs the server's token"):
        await JupyterBackend.open(
            JupyterOptions(workspace_root=tmp_path / "ws", mode=ServerKernels(url=server.url, token=""))
        )


async def test_unknown_kernel_spec_is_refused(server: LocalServer, tmp_path: Path) -> None:
    with pytest.raises(SetupFailed, match=r"no kernel spec 'nope' \(it has: .*python3"):
        await JupyterBackend.open(
            JupyterOptions(
                kernel_name="nope",
                workspace_root=tmp_path / "ws",
                mode=ServerKernels(url=server.url, token=server.token),
            )
        )


async def test_no_server_gives_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BackendError, match=f"cannot reach the Jupyter server at http://127.0.0.1:{port}.*running"):
        await JupyterBackend.open(
            JupyterOptions(
                workspace_root=tmp_path / "ws", mode=ServerKernels(url=f"http://127.0.0.1:{port}", token="t" * 43)
            )
        )


@pytest.mark.slow
async def test_kernel_gateway_works_and_its_death_is_a_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("kernel_gateway")
    async with start_local_server(tmp_path, kind="gateway") as gw:
        api = ServerApi(gw.url, "")
        try:
            assert await api.status_without_token() in (401, 403)
        finally:
            api.close()
        async with await JupyterBackend.open(
            JupyterOptions(
                workspace_root=tmp_path / "ws", interrupt_grace=1.0, mode=ServerKernels(url=gw.url, token=gw.token)
            )
        ) as eng:
            ks: RemoteKernelSessions = eng.kernels
            ws = await eng.manager.create_workspace("gw")
            first = await ks.execute(ws, "import os\nx = 5\nprint(os.getpid(), os.getcwd())")
            kernel_pid, cwd = first.text.split()
            assert cwd == str(ws.host_path / "work")
            assert (await ks.execute(ws, "x * 2")).text == "10\n"
            loop = await ks.execute(ws, "while True:\n    pass", timeout=1.0)
            assert loop.timed_out and not loop.state_lost
            os.kill(gw.pid, signal.SIGKILL)  # the gateway crashes
            try:
                with pytest.raises(BackendError, match="cannot reach the Jupyter server"):
                    await ks.execute(ws, "print(x)", timeout=10)
                assert await wait_dead(int(kernel_pid))  # ipykernel exits when its parent is gone
            finally:
                if alive(int(kernel_pid)):
                    os.kill(int(kernel_pid), signal.SIGKILL)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make a test certificate")
async def test_https_server_needs_a_trusted_certificate(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    root = tmp_path / "root"
    root.mkdir()
    async with start_local_server(root, certfile=str(cert), keyfile=str(key), ca_file=str(cert)) as srv:
        assert srv.url.startswith("https://127.0.0.1:")
        with pytest.raises(BackendError, match="TLS certificate not trusted"):
            await JupyterBackend.open(
                JupyterOptions(workspace_root=root / "ws", mode=ServerKernels(url=srv.url, token=srv.token))
            )
        async with await JupyterBackend.open(
            JupyterOptions(
                workspace_root=root / "ws", mode=ServerKernels(url=srv.url, token=srv.token, ca_file=str(cert))
            )
        ) as eng:
            ws = await eng.manager.create_workspace("tls")
            cell = await eng.kernels.execute(ws, "print(6 * 7)")
            assert cell.text == "42\n"


async def test_programs_can_be_refused_so_code_runs_only_on_the_server(server: LocalServer) -> None:
    root = server.root_dir / f"ws{next(_engines)}"
    async with await JupyterBackend.open(
        JupyterOptions(workspace_root=root, mode=ServerKernels(url=server.url, token=server.token, programs="refuse"))
    ) as eng:
        ws = await eng.manager.create_workspace("k-only")
        with pytest.raises(CapabilityError, match="programs='refuse'"):
            await eng.runner.run_program(ws, RunProgramSpec("touch", ["ran"], cwd="work"))
        assert not (ws.host_path / "work" / "ran").exists()
        assert eng.describe().languages == ("python",) and not eng.describe().streaming
        assert str(eng.describe().isolation) == "remote"  # nothing runs on this host
        ex = CodeExecutor(eng, timeout=30)
        result = await ex.execute_code(
            CodeExecutionInput([CodeBlock("python", "print('in kernel')"), CodeBlock("bash", "touch ran2")])
        )
        assert "in kernel" in result.output and not result.ok
        assert result.blocks[1].error is not None and "no runtime for bash" in result.blocks[1].error
        assert not list(root.rglob("ran2"))


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)")
async def test_server_that_cannot_see_the_workspace_is_refused(tmp_path: Path) -> None:
    # a real "remote" filesystem view: the server runs in its own mount namespace, where an empty tmpfs hides
    # the workspace root (the kernel sees a directory of that name, but not our files)
    ws_root = tmp_path / "ws"
    ws_root.mkdir(mode=0o700)
    hide = ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount -t tmpfs none "$0" && exec "$@"']
    async with start_local_server(tmp_path, wrapper=[*hide, str(ws_root)]) as srv:
        async with await JupyterBackend.open(
            JupyterOptions(workspace_root=ws_root, mode=ServerKernels(url=srv.url, token=srv.token))
        ) as eng:
            ws = await eng.manager.create_workspace("far")
            with pytest.raises(SetupFailed, match=r"do not see this host's workspace .* \(no shared filesystem"):
                await eng.kernels.execute(ws, "print(1)")
            assert not list((ws.host_path / "runs").glob("kernel-*/bind-nonce"))  # no nonce left behind
        api = ServerApi(srv.url, srv.token)
        try:
            assert await api.kernel_ids() == []  # the kernel that could not be bound was deleted
        finally:
            api.close()


async def test_output_flood_is_capped(kernels: RemoteKernelSessions, ws: Workspace) -> None:
    cell = await kernels.execute(
        ws, "for i in range(20000):\n    print('x' * 99)\nprint('END')", output_bytes=10_000, timeout=30
    )
    assert cell.exit_code == 0 and cell.truncated
    assert len(cell.text.encode()) < 11_000 and "bytes omitted" in cell.text and cell.text.endswith("END\n")


async def test_cancelled_call_interrupts_its_cell(kernels: RemoteKernelSessions, ws: Workspace) -> None:
    await kernels.execute(ws, "kept = 7")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(kernels.execute(ws, "while True:\n    pass", timeout=None), 1.0)
    after = await kernels.execute(ws, "print(kept)", timeout=10)
    assert after.text == "7\n" and not after.state_lost


async def test_sandbox_options_are_refused_for_a_remote_server(server: LocalServer) -> None:
    # a server mode has no sandbox options, and none can be passed beside it
    for bad in ({"policy": None}, {"network": False}):
        with pytest.raises(InvalidSpec, match="has no option"):
            async with open_engine("jupyter", mode=ServerKernels(server.url, server.token), **bad):
                pass
    with pytest.raises(InvalidSpec, match="not a kernel mode"):
        async with open_engine("jupyter", mode={"url": server.url, "token": server.token}):
            pass
