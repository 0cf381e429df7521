"""Snapshots and forks on the e2b backend, against a real ``execspace serve`` (which keeps files-only snapshots)
and, for the refusal, a service that does not: detected, never assumed."""

from __future__ import annotations

import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import execspace
from execspace import CapabilityError, InvalidSpec, PutFile, RunProgramSpec, SnapshotNotFound, Workspace

pytest.importorskip("e2b", reason="the e2b backend needs the official SDK (pip install 'execspace[e2b]')")
pytest.importorskip("uvicorn", reason="the tests run against execspace serve (pip install 'execspace[serve]')")

from e2b import AsyncSandbox

from execspace.backends.e2b.sandboxes import workspace_key
from tests.backends import test_e2b as e2b_suite
from tests.backends.test_e2b import _connection, _engine, _running
from tests.server.conftest import Server

MiB = 1024 * 1024
mark = e2b_suite.mark  # the fixture: metadata unique to a test, whose sandboxes are killed after it


async def _text(engine: execspace.BaseEngine, ws: Workspace, path: str) -> str:
    return (await engine.fs.read_file(ws, path)).content.decode()


async def _names(engine: execspace.BaseEngine, ws: Workspace) -> set[str]:
    return {e.path for e in await engine.fs.list(ws, ["work/*"])} - {"work/inputs"}


async def test_forks_of_a_live_workspace_are_branches_of_their_own(e2b_server: Server, mark: str) -> None:
    async with _engine(e2b_server, metadata={"execspace.test": mark}) as engine:
        parent = await engine.manager.create_workspace("fork-parent")
        await engine.fs.put_files(parent, [PutFile("work/a.txt", b"base\n"), PutFile("work/gone.txt", b"x")])
        before = await engine.manager.list_snapshots()
        one, two = await engine.manager.fork(parent, 2, ["fork-one", "fork-two"])
        assert await engine.manager.fork_mode() in ("cow", "copy")
        for fork in (one, two):
            assert await _text(engine, fork, "work/a.txt") == "base\n"
        await engine.fs.put_files(one, [PutFile("work/a.txt", b"one\n")])
        for fork, change in ((two, "rm gone.txt"), (one, "mv a.txt b.txt")):
            assert (
                await engine.runner.run_program(fork, RunProgramSpec("sh", ["-c", change], cwd="work"))
            ).exit_code == 0
        assert await _names(engine, parent) == {"work/a.txt", "work/gone.txt"}
        assert await _text(engine, parent, "work/a.txt") == "base\n"
        assert await _names(engine, one) == {"work/b.txt", "work/gone.txt"}
        assert await _names(engine, two) == {"work/a.txt"}
        # each fork is a sandbox of its own, found by its own key; the snapshot made for the fork is gone
        keys = sorted((await _running(e2b_server, **{"execspace.test": mark})).values())
        assert keys == sorted(workspace_key(w.id) for w in (parent, one, two))
        assert [s.id for s in await engine.manager.list_snapshots()] == [s.id for s in before]
        with pytest.raises(InvalidSpec, match="exists"):
            await engine.manager.fork(parent, 1, ["fork-one"])


async def test_a_session_fork_is_found_again_by_another_engine(e2b_server: Server, mark: str) -> None:
    async with _engine(e2b_server, metadata={"execspace.test": mark}) as first:
        parent = await first.manager.create_workspace("found-parent")
        await first.fs.put_files(parent, [PutFile("work/note.txt", b"parent")])
        (fork,) = await first.manager.fork(parent, ids=["found-fork"])
        await first.fs.put_files(fork, [PutFile("work/note.txt", b"fork")])
    async with _engine(e2b_server, metadata={"execspace.test": mark}) as second:
        assert await _text(second, await second.manager.get_workspace("found-fork"), "work/note.txt") == "fork"
        assert await _text(second, await second.manager.get_workspace("found-parent"), "work/note.txt") == "parent"


async def test_snapshot_restore_and_fork_from_it(e2b_server: Server, mark: str) -> None:
    async with _engine(e2b_server, metadata={"execspace.test": mark}) as engine:
        ws = await engine.manager.create_workspace("snap-ws")
        await engine.fs.put_files(ws, [PutFile("work/keep.txt", b"v1"), PutFile("work/run.sh", b"echo hi", 0o755)])
        snap = await engine.manager.snapshot(ws, f"snap-{mark[-12:]}")
        assert snap.workspace == "snap-ws"
        assert snap.id in [s.id for s in await engine.manager.list_snapshots()]
        await engine.fs.put_files(ws, [PutFile("work/keep.txt", b"v2"), PutFile("work/new.txt", b"new")])
        assert (await engine.runner.run_program(ws, RunProgramSpec("rm", ["run.sh"], cwd="work"))).exit_code == 0
        (old,) = await _running(e2b_server, **{"execspace.test": mark})
        await engine.manager.restore(ws, snap.name or "")
        assert await _names(engine, ws) == {"work/keep.txt", "work/run.sh"}
        assert await _text(engine, ws, "work/keep.txt") == "v1"
        ran = await engine.runner.run_program(ws, RunProgramSpec("./run.sh", cwd="work"))
        assert (ran.exit_code, ran.stdout) == (0, "hi\n")  # its mode came back too
        # the workspace is in a new sandbox; the old one, which held its key too, is gone
        running = await _running(e2b_server, **{"execspace.test": mark})
        assert old not in running and len(running) == 1
        (fork,) = await engine.manager.fork(snap.id, ids=["from-snap"])
        assert await _text(engine, fork, "work/keep.txt") == "v1"
        await engine.manager.remove_snapshot(snap)
        assert snap.id not in [s.id for s in await engine.manager.list_snapshots()]
        assert await _text(engine, fork, "work/keep.txt") == "v1"  # what came from it stands on its own
        with pytest.raises(SnapshotNotFound):
            await engine.manager.fork(snap.id)
        with pytest.raises(SnapshotNotFound):
            await engine.manager.remove_snapshot(snap.id)


async def test_a_fork_copies_nothing_on_a_copy_on_write_server(e2b_server: Server, mark: str) -> None:
    """The fork keeps its source's directory name (renaming a lower layer's directory would copy it up whole):
    its overlay upper holds only its changes."""
    async with _engine(e2b_server, metadata={"execspace.test": mark}) as engine:
        ws = await engine.manager.create_workspace("cow-parent")
        await engine.fs.put_files(ws, [PutFile("work/big.bin", os.urandom(4 * MiB))])
        (fork,) = await engine.manager.fork(ws, ids=["cow-fork"])
        if await engine.manager.fork_mode() != "cow":
            pytest.skip("the server forks by copies here (it runs as a normal user)")
        assert len((await engine.fs.read_file(fork, "work/big.bin")).content) == 4 * MiB
        uppers = list((e2b_server.root / ".layers").glob("*/upper"))
        assert uppers and all(_bytes(u) < MiB for u in uppers)


def _bytes(top: Path) -> int:
    return sum(p.lstat().st_size for p in top.rglob("*") if p.is_file() and not p.is_symlink())


async def test_a_snapshot_taken_by_another_engine_forks_too(e2b_server: Server, mark: str) -> None:
    async with _engine(e2b_server, metadata={"execspace.test": mark}) as first:
        ws = await first.manager.create_workspace("elsewhere")
        await first.fs.put_files(ws, [PutFile("work/note.txt", b"from the first engine")])
        snap = await first.manager.snapshot(ws)
    async with _engine(e2b_server, metadata={"execspace.test": mark}) as second:
        listed = await second.manager.get_snapshot(snap.id)
        assert (listed.workspace, listed.size) == ("", 0)  # the service says only its id and names
        (fork,) = await second.manager.fork(snap.id, ids=["elsewhere-fork"])
        assert await _text(second, fork, "work/note.txt") == "from the first engine"
        await second.manager.remove_snapshot(snap.id)
    async with _engine(e2b_server, metadata={"execspace.test": mark}) as third:
        found = await third.manager.get_workspace("elsewhere-fork")
        assert await _text(third, found, "work/note.txt") == "from the first engine"


async def test_a_bad_snapshot_name_is_the_callers_to_fix(e2b_server: Server, mark: str) -> None:
    async with _engine(e2b_server, metadata={"execspace.test": mark}) as engine:
        ws = await engine.manager.create_workspace("bad-name")
        with pytest.raises(InvalidSpec, match="snapshot name"):
            await engine.manager.snapshot(ws, "../no")


async def test_a_shared_sandbox_is_not_snapshotted(e2b_server: Server, mark: str) -> None:
    theirs = await AsyncSandbox.create(template="base", metadata={"execspace.test": mark}, **_connection(e2b_server))
    async with _engine(e2b_server, sandbox_id=theirs.sandbox_id) as engine:
        ws = await engine.manager.create_workspace("guest")
        with pytest.raises(CapabilityError, match="shared sandbox"):
            await engine.manager.snapshot(ws)
        with pytest.raises(CapabilityError, match="shared sandbox"):
            await engine.manager.fork(ws)


@pytest.fixture
def other_service(tmp_path: Path) -> Iterator[str]:
    """A real HTTP server that is no execspace serve: it answers GET /snapshots (200) without saying how it
    forks, as a service with memory snapshots would."""
    (tmp_path / "snapshots").write_text("[]")
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_a_service_without_file_snapshots_refuses(other_service: str) -> None:
    async with execspace.open_engine("e2b", api_url=other_service, sandbox_url=other_service, api_key="k") as engine:
        ws = Workspace(id="any", path="/home/user/.execspace/ws/any", backend="e2b")
        for attempt in (engine.manager.fork_mode(), engine.manager.snapshot(ws), engine.manager.fork(ws)):
            with pytest.raises(CapabilityError, match="files-only snapshots"):
                await attempt
