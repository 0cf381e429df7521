"""The audit log of the backends whose programs this process does not start itself (docs/operations.md "Audit log",
"From the library"): the container backend on a real daemon, the jupyter backend with real kernels (on the host, in
the sandbox, on a Jupyter Server's own workspaces) and the e2b backend against a real ``execspace serve``. Each
action the API takes has its line by the time the call returns (a started program's end: by the time ``wait()``
returns), with the fields of the local and sandbox backends' lines and where it ran (the container, the remote
sandbox); never a file's content, a variable's value, stdin or a cell's code; every line whole."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

import execspace
from execspace import PutFile, RunProgramSpec
from execspace.audit import AuditLog
from execspace.protocols import CellKernels, SupportsKernels
from execspace.testing.binding import make_traversable
from tests.support import audit_entries, audit_lines

pytestmark = pytest.mark.timeout(240)

CONTENT = "file-content-5521"
VALUE = "env-value-7730"
STDIN = "stdin-bytes-9182"
CODE = "cell-code-6604"
SECRETS = (CONTENT, VALUE, STDIN, CODE)

_remote_roots = itertools.count()

Opener = Callable[[AuditLog], AbstractAsyncContextManager[execspace.BaseEngine]]


async def exercise(engine: execspace.BaseEngine, path: Path, *, remote: bool) -> None:
    """Every audited action once, each line checked as soon as its call returns; ``remote``: each line also names
    the remote sandbox the workspace is in (the one its creation's line names)."""
    ws = await engine.manager.create_workspace("audited")
    (created,) = audit_entries(path, "workspace.create", workspace=ws.id)
    assert created["backend"] == ws.backend
    place = {"sandbox": created["sandbox"]} if remote else {}
    assert not remote or (isinstance(created["sandbox"], str) and created["sandbox"])

    await engine.fs.put_files(ws, [PutFile("work/a.txt", CONTENT)])
    assert audit_entries(path, "file.write", workspace=ws.id, path="work/a.txt", size=len(CONTENT), **place)
    await engine.fs.rename(ws, "work/a.txt", "work/b.txt")
    assert audit_entries(path, "file.rename", workspace=ws.id, path="work/a.txt", to="work/b.txt", **place)
    await engine.fs.remove(ws, "work/b.txt")
    assert audit_entries(path, "file.remove", workspace=ws.id, path="work/b.txt", **place)

    if engine.describe().programs:
        await _programs(engine, ws, path, place)

    if isinstance(engine, SupportsKernels):
        kernels = engine.kernels
        assert isinstance(kernels, CellKernels)
        code = f"x = {CODE!r}\nprint(len(x))"
        cell = await kernels.execute(ws, code)
        assert cell.exit_code == 0, cell.text
        (line,) = audit_entries(path, "cell.execute", workspace=ws.id, **place)
        assert line["language"] == "python" and line["code_bytes"] == len(code.encode())

    await engine.manager.cleanup(ws)
    assert audit_entries(path, "workspace.cleanup", workspace=ws.id, backend=ws.backend, **place)


async def _programs(engine: execspace.BaseEngine, ws: execspace.Workspace, path: Path, place: dict[str, Any]) -> None:
    spec = RunProgramSpec("sh", ["-c", "cat >/dev/null; exit 5"], env={"AUDIT_SECRET": VALUE}, stdin=STDIN)
    result = await engine.runner.run_program(ws, spec)
    assert result.exit_code == 5, result.stderr
    (start,) = audit_entries(path, "command.start", workspace=ws.id, argv=[spec.cmd, *spec.args], **place)
    assert start["env_names"] == ["AUDIT_SECRET"] and start["cwd"] == spec.cwd and "user" in start
    (end,) = audit_entries(path, "command.end", workspace=ws.id, argv=[spec.cmd, *spec.args], **place)
    assert end["exit_code"] == 5 and isinstance(end["pid"], int) and end["pid"] > 0
    assert end["timed_out"] is False and end["limit_hit"] is None and end["duration_s"] >= 0

    handle = await engine.runner.start_program(ws, RunProgramSpec("sh", ["-c", "exit 6"]))
    assert audit_entries(path, "command.start", workspace=ws.id, argv=["sh", "-c", "exit 6"], **place)
    assert (await handle.wait()).exit_code == 6
    assert handle.pid is not None
    assert audit_entries(path, "command.end", workspace=ws.id, exit_code=6, pid=handle.pid, **place)


async def audited_run(tmp_path: Path, opener: Opener, *, remote: bool = False) -> list[dict[str, Any]]:
    """``exercise`` on the engine ``opener`` opens; the file's lines, each parsed (a torn line fails)."""
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path)
    try:
        async with opener(audit) as engine:
            await exercise(engine, path, remote=remote)
    finally:
        audit.close()
    lines = audit_lines(path)
    assert all(isinstance(line["time"], str) for line in lines)
    text = path.read_text()
    assert not [secret for secret in SECRETS if secret in text]
    return lines


# -- container --------------------------------------------------------------------------------------


async def test_container(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    pytest.importorskip("docker", reason="the docker SDK is not installed (pip install 'execspace[docker]')")
    from tests.backends.container_support import container_engine

    daemon, image = request.getfixturevalue("docker_daemon"), request.getfixturevalue("test_image")

    def opener(audit: AuditLog) -> AbstractAsyncContextManager[execspace.BaseEngine]:
        return container_engine(daemon, image, tmp_path / "ws", audit=audit, pool_size=0)

    lines = await audited_run(tmp_path, opener)
    runs = [line for line in lines if line["event"].startswith("command.")]
    assert len(runs) == 4  # what docker exec ran: each line names the container
    assert all(isinstance(line["container"], str) and len(line["container"]) == 12 for line in runs)


# -- jupyter ----------------------------------------------------------------------------------------


def _jupyter(**options: Any) -> Opener:
    pytest.importorskip("jupyter_client", reason="needs the jupyter extra (pip install 'execspace[jupyter]')")

    def opener(audit: AuditLog) -> AbstractAsyncContextManager[execspace.BaseEngine]:
        return execspace.open_engine("jupyter", audit=audit, **options)  # type: ignore[call-overload,no-any-return]

    return opener


async def test_jupyter_host_kernels(tmp_path: Path) -> None:
    from execspace.backends.jupyter import HostKernels

    lines = await audited_run(tmp_path, _jupyter(workspace_root=tmp_path / "ws", mode=HostKernels(pool_size=0)))
    assert [line["event"] for line in lines].count("cell.execute") == 1


async def test_jupyter_sandboxed_kernels(tmp_path: Path) -> None:
    from execspace.backends.jupyter import SandboxedKernels
    from tests.backends.jupyter_support import require_sandboxed_kernels

    await require_sandboxed_kernels()
    make_traversable(tmp_path)  # as root, each sandbox's own uid must reach its workspace
    await audited_run(tmp_path, _jupyter(workspace_root=tmp_path / "ws", mode=SandboxedKernels(pool_size=0)))


async def test_jupyter_server_workspaces(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    from execspace.backends.jupyter import ServerKernels

    server = request.getfixturevalue("jupyter_server")
    root = f"audit{next(_remote_roots)}"
    mode = ServerKernels(url=server.url, token=server.token, shared_filesystem=False, remote_root=root)
    lines = await audited_run(tmp_path, _jupyter(mode=mode))
    assert not [line for line in lines if line["event"].startswith("command.")]  # it runs no programs


# -- e2b --------------------------------------------------------------------------------------------


async def test_e2b_against_serve(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    pytest.importorskip("e2b", reason="the e2b backend needs the official SDK (pip install 'execspace[e2b]')")
    server = request.getfixturevalue("e2b_server")
    connection = {"api_url": server.url, "sandbox_url": server.url, "api_key": server.key}

    @contextlib.asynccontextmanager
    async def opener(audit: AuditLog) -> AsyncIterator[execspace.BaseEngine]:
        async with execspace.open_engine(
            "e2b", template="code-interpreter-v1", persistence="turn", kill_grace=1.0, audit=audit, **connection
        ) as engine:
            yield engine

    lines = await audited_run(tmp_path, opener, remote=True)
    assert len({line["sandbox"] for line in lines}) == 1  # the workspace's own sandbox, on every line
