"""The warm pool against a real daemon: a new workspace gets a pre-started container, clean and its own."""

from __future__ import annotations

from pathlib import Path

import pytest

import execspace
from execspace import WorkspacePolicy
from execspace.errors import SetupFailed
from execspace.models import Persistence
from execspace.workspace.layout import LAYOUT_DIRS, METADATA_FILE
from execspace.workspace.slots import SLOT_PREFIX
from tests.backends.container_support import container_engine, engine_containers, engine_fixture, sh
from tests.backends.docker_fixture import Daemon

pytest.importorskip("docker", reason="the docker SDK is not installed (pip install 'execspace[docker]')")


pooled = engine_fixture(pool_size=1, warm=True)


async def _container_of(engine: execspace.BaseEngine, ws: execspace.Workspace) -> str:
    r = await engine.runner.run_program(ws, sh("hostname"))  # the daemon names the host after the container
    assert r.exit_code == 0, r.stderr
    return r.stdout.strip()


async def test_new_workspace_runs_in_the_prestarted_container(
    docker_daemon: Daemon, pooled: execspace.BaseEngine
) -> None:
    warm = set(engine_containers(docker_daemon, pooled))
    assert len(warm) == 1
    ws = await pooled.manager.create_workspace("pool/a")
    used = await _container_of(pooled, ws)
    assert any(cid.startswith(used) for cid in warm)
    await pooled.pool.ready()
    # the pool refilled with a different container; the workspace keeps its own
    now = engine_containers(docker_daemon, pooled)
    assert len(now) == 2 and warm < set(now)
    assert await _container_of(pooled, ws) == used


async def test_each_pooled_container_serves_one_workspace_and_starts_clean(pooled: execspace.BaseEngine) -> None:
    pool = pooled.pool
    a = await pooled.manager.create_workspace("pool/a")
    r = await pooled.runner.run_program(a, sh("echo a > /tmp/left; echo a > /workspace/work/left; ls -A /tmp"))
    assert r.stdout == "left\n"
    await pool.ready()
    b = await pooled.manager.create_workspace("pool/b")
    assert await _container_of(pooled, a) != await _container_of(pooled, b)
    r = await pooled.runner.run_program(b, sh("ls -A /tmp; echo --; ls -A /workspace; echo --; ls -A /workspace/work"))
    assert r.exit_code == 0, r.stderr
    tmp, top, work = (part.split() for part in r.stdout.split("--\n"))
    # nothing of a's, and exactly the fresh layout
    assert tmp == []
    assert top == sorted({d.split("/")[0] for d in LAYOUT_DIRS} | {METADATA_FILE})
    assert work == ["inputs"]
    assert b.host_path is not None and sorted(p.name for p in b.host_path.iterdir()) == top


async def test_turn_workspaces_use_the_pool_too(docker_daemon: Daemon, pooled: execspace.BaseEngine) -> None:
    warm = set(engine_containers(docker_daemon, pooled))
    ws = await pooled.manager.create_workspace("pool/turn", WorkspacePolicy(persistence=Persistence.TURN))
    used = await _container_of(pooled, ws)
    assert any(cid.startswith(used) for cid in warm)
    assert ws.host_path is not None and ws.host_path.stat().st_mode & 0o777 == 0o700


async def test_an_existing_workspace_directory_never_takes_a_slot(
    docker_daemon: Daemon, test_image: str, tmp_path: Path
) -> None:
    """Reopening a session's directory must not rename a slot over it: the pool keeps its container."""
    async with container_engine(docker_daemon, test_image, tmp_path / "ws", pool_size=0) as first:
        old = await first.manager.create_workspace("kept")
        assert old.host_path is not None
        (old.host_path / "work" / "note.txt").write_text("still here\n")
    async with container_engine(docker_daemon, test_image, tmp_path / "ws", pool_size=1) as second:
        pool = second.pool
        await pool.ready()
        warm = set(engine_containers(docker_daemon, second))
        again = await second.manager.create_workspace("kept")
        r = await second.runner.run_program(again, sh("cat /workspace/work/note.txt; hostname"))
        note, host = r.stdout.split("\n")[:2]
        assert note == "still here"
        assert not any(cid.startswith(host) for cid in warm)
        assert pool.available() == 1


async def test_close_removes_pool_containers_and_slot_directories(
    docker_daemon: Daemon, test_image: str, tmp_path: Path
) -> None:
    root = tmp_path / "ws"
    async with container_engine(docker_daemon, test_image, root, pool_size=2) as eng:
        await eng.pool.ready()
        ws = await eng.manager.create_workspace("pool/closing")
        await eng.runner.run_program(ws, sh("true"))
        await eng.pool.ready()
        assert len(engine_containers(docker_daemon, eng)) == 3
        assert len(list(root.glob(f"{SLOT_PREFIX}*"))) == 2
    assert engine_containers(docker_daemon, eng) == {}
    assert list(root.glob(f"{SLOT_PREFIX}*")) == []
    assert ws.host_path is not None and ws.host_path.is_dir()  # the workspace's files are kept, as elsewhere


async def test_a_pool_that_cannot_fill_fails_the_run_not_the_open(
    docker_daemon: Daemon, test_image: str, tmp_path: Path
) -> None:
    # the daemon refuses to create any container with more CPUs than the host has (the image is checked at open)
    root = tmp_path / "ws"
    async with container_engine(docker_daemon, test_image, root, pool_size=1, cpus=1000.0) as eng:
        pool = eng.pool
        await pool.ready()
        assert isinstance(pool.last_error, SetupFailed) and pool.available() == 0
        assert list(root.glob(f"{SLOT_PREFIX}*")) == []  # a failed slot leaves no directory behind
        ws = await eng.manager.create_workspace("no-container")
        with pytest.raises(SetupFailed, match="CPU"):
            await eng.runner.run_program(ws, sh("true"))
