"""``engine.kernels`` of the e2b backend is the jupyter backend's surface (:class:`execspace.CellKernels`): the same
notebook, written once against the protocol, runs on a jupyter engine and on an e2b engine against a real
``execspace serve``, and gives the same cells."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import execspace
from execspace import BaseEngine, CellKernels, CellResult

pytest.importorskip("e2b", reason="the e2b backend needs the official SDK (pip install 'execspace[e2b]')")
pytest.importorskip("uvicorn", reason="the tests run against execspace serve (pip install 'execspace[serve]')")
pytest.importorskip("jupyter_client", reason="the jupyter backend is the reference (pip install 'execspace[jupyter]')")

from execspace.backends.jupyter import HostKernels
from tests.server.conftest import Server

PNG = b"\x89PNG\r\n\x1a\nnot really"
SHOW_PNG = f"display({{'image/png': {base64.b64encode(PNG).decode()!r}}}, raw=True)"


@pytest.fixture(params=["jupyter", "e2b"])
async def engine(request: pytest.FixtureRequest, tmp_path: Path, e2b_server: Server) -> AsyncIterator[BaseEngine]:
    if request.param == "jupyter":
        opened = execspace.open_engine("jupyter", workspace_root=tmp_path / "ws", mode=HostKernels(pool_size=0))
    else:
        connection = {"api_url": e2b_server.url, "sandbox_url": e2b_server.url, "api_key": e2b_server.key}
        opened = execspace.open_engine("e2b", template="code-interpreter-v1", persistence="turn", **connection)
    async with opened as eng:
        yield eng


async def test_the_same_notebook_runs_on_both_engines(engine: BaseEngine) -> None:
    assert isinstance(engine, execspace.SupportsKernels)
    kernels = engine.kernels
    assert isinstance(kernels, CellKernels)
    ws = await engine.manager.create_workspace("notebook")

    first = await kernels.execute(ws, "x = 6 * 7\nprint('hi')\nx", timeout=60)
    assert _plain(first) == (0, "hi\n42\n", "", (), None), first

    shown = await kernels.execute(ws, SHOW_PNG, timeout=60)
    assert (shown.exit_code, shown.files) == (0, ("out/cell-2-1.png",)), shown
    assert (await engine.fs.read_file(ws, "out/cell-2-1.png")).content == PNG
    assert "[saved out/cell-2-1.png]" in shown.stdout

    failed = await kernels.execute(ws, "1/0", timeout=60)
    assert (failed.exit_code, failed.error) == (1, ("ZeroDivisionError", "division by zero")), failed
    assert "ZeroDivisionError" in failed.stderr and "ZeroDivisionError" in failed.text
    assert not (failed.timed_out or failed.kernel_died or failed.state_lost)

    kept = await kernels.execute(ws, "x + 1", timeout=60)
    assert _plain(kept) == (0, "43\n", "", (), None), kept

    capped = await kernels.execute(ws, "print('y' * 100_000)", timeout=60, output_bytes=1000)
    assert capped.exit_code == 0 and len(capped.stdout) <= 1100 and capped.truncated, len(capped.stdout)

    await kernels.shutdown(ws)
    await kernels.shutdown(ws)  # idempotent
    fresh = await kernels.execute(ws, "'x' in globals()", timeout=60)
    assert _plain(fresh)[:2] == (0, "False\n"), fresh
    await engine.manager.cleanup(ws)


async def test_a_new_engine_numbers_cells_after_those_in_out(engine: BaseEngine) -> None:
    """A cell's files never overwrite an earlier kernel's: numbering continues after the highest out/cell-N-*."""
    assert isinstance(engine, execspace.SupportsKernels)
    kernels = engine.kernels
    assert isinstance(kernels, CellKernels)
    ws = await engine.manager.create_workspace("numbers")
    await engine.fs.put_files(ws, [execspace.PutFile("out/cell-7-1.png", b"older")])
    shown = await kernels.execute(ws, SHOW_PNG, timeout=60)
    assert shown.files == ("out/cell-8-1.png",), shown
    assert (await engine.fs.read_file(ws, "out/cell-7-1.png")).content == b"older"
    await engine.manager.cleanup(ws)


def _plain(cell: CellResult) -> tuple[int, str, str, tuple[str, ...], tuple[str, str] | None]:
    return cell.exit_code, cell.stdout, cell.stderr, cell.files, cell.error


async def test_cleanup_in_a_shared_sandbox_ends_the_workspaces_kernels_only(e2b_server: Server) -> None:
    """A sandbox given by id outlives its workspaces: cleanup removes the workspace's kernels from its code
    interpreter, and leaves the others' alone."""
    from e2b_code_interpreter import AsyncSandbox

    connection = {"api_url": e2b_server.url, "sandbox_url": e2b_server.url, "api_key": e2b_server.key}
    theirs = await AsyncSandbox.create(template="code-interpreter-v1", **connection)
    try:
        before = {c.id for c in await theirs.list_code_contexts()}
        async with execspace.open_engine("e2b", sandbox_id=theirs.sandbox_id, **connection) as engine:
            assert isinstance(engine, execspace.SupportsKernels) and isinstance(engine.kernels, CellKernels)
            gone, stays = [await engine.manager.create_workspace(name) for name in ("gone", "stays")]
            for ws in (gone, stays):
                assert (await engine.kernels.execute(ws, f"mine = {len(ws.id)}", timeout=60)).exit_code == 0
            ours = {c.id for c in await theirs.list_code_contexts()} - before
            assert len(ours) == 2
            await engine.manager.cleanup(gone)
            left = {c.id for c in await theirs.list_code_contexts()} - before
            assert len(left) == 1 and left < ours
            assert (await engine.kernels.execute(stays, "mine", timeout=60)).stdout == "5\n"
        assert await theirs.is_running()
    finally:
        await theirs.kill()
