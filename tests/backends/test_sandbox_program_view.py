"""Paths as the sandbox's programs see them (what inspect_ai's self-check does through the public API): ``/tmp`` is
the workspace's and lasts from run to run, a run starts in any directory of the view, the file API reaches the
rest of the view through the file agent with the program's permissions, and a user the sandbox has no entry for
is a 126 naming it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import execspace
from execspace import CapabilityError, PathDenied, PutFile, RunProgramSpec
from execspace.backends.sandbox import SandboxPolicy
from execspace.registry import probe_backend
from tests.support import make_traversable

pytestmark = pytest.mark.timeout(120)

MODES: dict[str, Mapping[str, Any]] = {"per-run": {}, "session": {"mode": "session"}}


@pytest_asyncio.fixture(params=list(MODES))
async def box(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[execspace.BaseEngine, Any]]:
    if not (await probe_backend("sandbox")).ok:
        pytest.skip("no working sandbox here")
    make_traversable(tmp_path)
    granted = tmp_path / "granted"
    granted.mkdir()
    (granted / "open.txt").write_text("for everyone\n")
    (granted / "private.txt").write_text("for its owner\n")
    (granted / "private.txt").chmod(0o600)
    if os.geteuid() == 0:
        os.chown(granted / "private.txt", 4242, 4242)  # another owner's, which the grant does not make the program's
    policy = SandboxPolicy().with_read_paths(granted)
    options = MODES[request.param]
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", policy=policy, **options) as engine:
        yield engine, await engine.manager.create_workspace("view")


async def sh(box: tuple[execspace.BaseEngine, Any], script: str, **spec: Any) -> execspace.RunResult:
    engine, ws = box
    return await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", script], **spec))


async def test_tmp_is_the_workspaces_and_lasts_from_run_to_run(box: tuple[execspace.BaseEngine, Any]) -> None:
    engine, ws = box
    assert engine.describe().absolute_paths == "view"
    await engine.fs.put_files(ws, [PutFile("/tmp/t/by-api.txt", b"api\n")])
    r = await sh(box, "cat /tmp/t/by-api.txt; echo prog > /tmp/t/by-prog.txt; ls $TMPDIR/t")
    assert r.stdout == "api\nby-api.txt\nby-prog.txt\n", r.stderr
    assert (await engine.fs.read_file(ws, "/tmp/t/by-prog.txt")).content == b"prog\n"
    assert ws.host_path is not None and (ws.host_path / "tmp/t/by-prog.txt").read_text() == "prog\n"
    r = await sh(box, "ls", cwd="/tmp/t")
    assert r.stdout == "by-api.txt\nby-prog.txt\n", r.stderr
    with pytest.raises(IsADirectoryError, match="directory"):
        await engine.fs.put_files(ws, [PutFile("/tmp/t", b"over a directory")])


async def test_a_run_starts_in_any_directory_of_the_view(box: tuple[execspace.BaseEngine, Any], tmp_path: Path) -> None:
    r = await sh(box, "pwd; ls | grep -x env")
    assert r.stdout.startswith("/workspace/work\n"), r.stderr
    r = await sh(box, "pwd; ls | grep -x env", cwd="/usr/bin")
    assert (r.exit_code, r.stdout) == (0, "/usr/bin\nenv\n"), r.stderr
    r = await sh(box, "cat open.txt", cwd=str(tmp_path / "granted"))
    assert r.stdout == "for everyone\n", r.stderr
    r = await sh(box, "pwd", cwd="/no/such/dir")
    assert (r.exit_code, r.stdout) == (126, "") and "/no/such/dir" in r.stderr, (r.exit_code, r.stderr)


async def test_the_file_api_reaches_the_view_with_the_programs_permissions(
    box: tuple[execspace.BaseEngine, Any], tmp_path: Path
) -> None:
    engine, ws = box
    hostname = (await sh(box, "cat /etc/hostname")).stdout
    assert (await engine.fs.read_file(ws, "/etc/hostname")).text == hostname
    with pytest.raises(IsADirectoryError, match="directory"):
        await engine.fs.read_file(ws, "/etc")
    with pytest.raises(FileNotFoundError, match="/etc/no-such-file"):
        await engine.fs.read_file(ws, "/etc/no-such-file")
    with pytest.raises(PathDenied):
        await engine.fs.put_files(ws, [PutFile("/etc/planted", b"x")])
    with pytest.raises(PathDenied):
        await engine.fs.remove(ws, "/etc/hostname")
    assert not Path("/etc/planted").exists()
    granted = tmp_path / "granted"
    assert (await engine.fs.read_file(ws, str(granted / "open.txt"))).content == b"for everyone\n"
    names = {e.path for e in await engine.fs.list_dir(ws, str(granted))}
    assert names == {f"{granted}/open.txt", f"{granted}/private.txt"}
    if os.geteuid() == 0:  # as root the host could read it: the agent, as the program, may not
        with pytest.raises(PathDenied):
            await engine.fs.read_file(ws, str(granted / "private.txt"))
    with pytest.raises(PathDenied):  # a read grant is read-only to the file API as to the program
        await engine.fs.put_files(ws, [PutFile(str(granted / "new.txt"), b"x")])
    assert sorted(p.name for p in granted.iterdir()) == ["open.txt", "private.txt"]


async def test_a_user_the_sandbox_lacks_is_a_126_naming_it(box: tuple[execspace.BaseEngine, Any]) -> None:
    engine, ws = box
    r = await engine.runner.run_program(ws, RunProgramSpec("whoami", user="no-such-user-xyz"))
    assert r.exit_code == 126 and "no-such-user-xyz" in r.stderr and r.stdout == "", r
    with pytest.raises(execspace.UserNotFound):
        await engine.runner.start_program(ws, RunProgramSpec("whoami", user="no-such-user-xyz"))
    with pytest.raises(CapabilityError, match="root"):  # there, but not one it can run as: fails closed
        await engine.runner.run_program(ws, RunProgramSpec("whoami", user="root"))
