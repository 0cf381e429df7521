"""Snapshots and forks of host-directory workspaces: what a fork starts from, what stays each branch's own, and
what a restore brings back (local and both sandbox modes, where programs really run in the forks)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import execspace
from execspace import (
    InputSpec,
    InvalidSpec,
    OutputSpec,
    PutFile,
    ResourceLimits,
    RunProgramSpec,
    SnapshotNotFound,
    Workspace,
)
from execspace.protocols import SupportsFileMetadata
from execspace.testing.processes import new_tag, pids_with, tagged, wait_no_process, wait_processes
from execspace.workspace.branches import MAX_DEPTH, overlay_supported
from execspace.workspace.hostmanager import HostWorkspaceManager, remove_workspace_tree
from execspace.workspace.layers import LAYERS_DIR, unmount
from execspace.workspace.metadata import load_metadata
from execspace.workspace.snapshots import SNAPSHOTS_DIR
from execspace.workspace.stored import stored_workspaces
from tests.bindings import open_backend
from tests.support import held_still, snapshot_files


@pytest.fixture(params=["local", "sandbox", "sandbox-session", "container"])
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[execspace.BaseEngine]:
    async with open_backend(request, request.param, tmp_path) as eng:
        try:
            yield eng
        finally:
            unmount_forks(manager(eng).root)


def unmount_forks(root: Path) -> None:
    """Copy-on-write forks are mounts that outlive their engine (they are kept workspaces): remove them."""
    for name in os.listdir(root / LAYERS_DIR) if (root / LAYERS_DIR).is_dir() else []:
        remove_workspace_tree(root / name)


cow_only = pytest.mark.skipif(not overlay_supported(), reason="copy-on-write forks need root and overlayfs")


def manager(engine: execspace.BaseEngine) -> HostWorkspaceManager:
    assert isinstance(engine.manager, HostWorkspaceManager)
    return engine.manager


def host(ws: Workspace) -> Path:
    assert ws.host_path is not None
    return ws.host_path


def tree(root: Path, under: str = "work") -> dict[str, tuple[int, bytes]]:
    """Every entry below ``root/under``: its mode and its bytes (a link's target text)."""
    out: dict[str, tuple[int, bytes]] = {}
    base = root / under
    for dirpath, dirs, files in os.walk(base):
        for name in [*dirs, *files]:
            p = Path(dirpath, name)
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                data = os.fsencode(os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                data = p.read_bytes()
            else:
                data = b""
            out[str(p.relative_to(base))] = (st.st_mode, data)
    return out


async def run(engine: execspace.BaseEngine, ws: Workspace, script: str) -> str:
    """Run ``script`` in the workspace's ``work/``."""
    result = await engine.runner.run_program(ws, RunProgramSpec("/bin/sh", ["-c", script], timeout=30))
    assert result.exit_code == 0, result.stderr
    return result.stdout


async def test_branches_see_the_parent_and_keep_their_changes_to_themselves(engine: execspace.BaseEngine) -> None:
    ws = await engine.manager.create_workspace("fork/parent")
    await engine.fs.put_files(ws, [PutFile("work/a.txt", b"parent a"), PutFile("work/d/b.txt", b"parent b")])
    await engine.fs.put_files(ws, [PutFile("work/c.txt", b"parent c")])
    one, two = await manager(engine).fork(ws, count=2)
    assert {one.id, two.id}.isdisjoint({ws.id}) and one.id != two.id
    # the fork sees the parent's files, by the file API and to a program run in it
    assert (await engine.fs.read_file(one, "work/a.txt")).content == b"parent a"
    assert await run(engine, one, "cat d/b.txt") == "parent b"
    # a program writes, deletes and renames in one branch; the file API does too
    await run(engine, one, "echo -n one > a.txt && rm d/b.txt && mv c.txt c2.txt && echo n > new")
    await engine.fs.put_files(one, [PutFile("work/api.txt", b"api")])
    await engine.fs.remove(two, "work/a.txt")
    assert (await engine.fs.read_file(one, "work/a.txt")).content == b"one"
    assert not await engine.fs.exists(one, "work/d/b.txt") and await engine.fs.exists(one, "work/c2.txt")
    for other in (ws, two):
        assert not await engine.fs.exists(other, "work/new") and not await engine.fs.exists(other, "work/api.txt")
        assert (await engine.fs.read_file(other, "work/d/b.txt")).content == b"parent b"
        assert (await engine.fs.read_file(other, "work/c.txt")).content == b"parent c"
    assert (await engine.fs.read_file(ws, "work/a.txt")).content == b"parent a"
    assert not await engine.fs.exists(two, "work/a.txt")
    assert await run(engine, ws, "cat a.txt; ls") == "parent a" + "a.txt\nc.txt\nd\ninputs\n"


async def test_directories_the_branch_shares_move_like_its_own(engine: execspace.BaseEngine) -> None:
    ws = await engine.manager.create_workspace("fork/moves")
    files = [PutFile("work/d/a.txt", b"a"), PutFile("work/d/sub/b.txt", b"b"), PutFile("work/e/c.txt", b"c")]
    await engine.fs.put_files(ws, files)
    (branch,) = await manager(engine).fork(ws)
    # a directory of the snapshot under an overlay cannot be renamed in place (EXDEV): both sides still move it
    await engine.fs.rename(branch, "work/d", "work/moved/d")
    assert await run(engine, branch, "mv e e2 && cat moved/d/a.txt moved/d/sub/b.txt e2/c.txt && ls") == (
        "abce2\ninputs\nmoved\n"
    )
    assert (await engine.fs.read_file(branch, "work/moved/d/sub/b.txt")).content == b"b"
    assert await run(engine, ws, "cat d/a.txt d/sub/b.txt e/c.txt") == "abc"


async def test_staging_and_collection_in_a_branch_record_the_branch(engine: execspace.BaseEngine) -> None:
    ws = await engine.manager.create_workspace("fork/staging")
    await engine.fs.stage_inputs(ws, [InputSpec(b"parent input", dest="work/inputs/p.txt")])
    await engine.fs.put_files(ws, [PutFile("out/parent.txt", b"parent out")])
    (branch,) = await manager(engine).fork(ws)
    await engine.fs.stage_inputs(branch, [InputSpec(b"branch input", dest="work/inputs/b.txt")])
    await run(engine, branch, "cat inputs/p.txt inputs/b.txt > ../out/both.txt")
    manifest = await engine.fs.collect_outputs(branch, OutputSpec(globs=["out/**"], inline=True))
    assert {f.name: f.content for f in manifest.files} == {
        "out/parent.txt": b"parent out",
        "out/both.txt": b"parent inputbranch input",
    }
    branch_meta = load_metadata(host(branch))
    assert branch_meta.id == branch.id and branch_meta.forked_from == f"workspace:{ws.id}"
    assert [r.dest for r in branch_meta.inputs] == ["work/inputs/p.txt", "work/inputs/b.txt"]
    parent_meta = load_metadata(host(ws))
    assert parent_meta.id == ws.id and [r.dest for r in parent_meta.inputs] == ["work/inputs/p.txt"]
    assert parent_meta.outputs == [] and not await engine.fs.exists(ws, "out/both.txt")


def _program_states(tag: str) -> dict[int, str]:
    """The state letter of each process of the tagged program (``sh`` and its ``sleep``), by host pid."""
    states = {}
    for pid in pids_with(tag):
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            stat_line = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if argv0 in (b"/bin/sh", b"sleep"):
            states[pid] = stat_line.rsplit(")", 1)[1].split()[0]
    return states


async def test_a_snapshot_stops_the_programs_for_its_instant(engine: execspace.BaseEngine) -> None:
    frozen = getattr(engine.runner, "frozen", None)
    if frozen is None or manager(engine)._freeze is None:
        pytest.skip(f"{engine.name} stops no processes one by one (a container is paused whole: tested below)")
    ws = await engine.manager.create_workspace("fork/frozen")
    tag = new_tag("freeze")
    script = "sleep 300 & while :; do echo tick >> ticks; done"
    spec = RunProgramSpec("/bin/sh", ["-c", script], env=tagged(tag), timeout=120)
    async with await engine.runner.start_program(ws, spec) as handle:
        await wait_processes(tag, 2)
        while len(_program_states(tag)) < 2:
            await asyncio.sleep(0.01)
        async with frozen(ws):
            assert all(held_still(pid) for pid in _program_states(tag)), _program_states(tag)
        while any(held_still(pid) for pid in _program_states(tag)):  # continued: polled, SIGCONT lands async
            await asyncio.sleep(0.01)
        snap = await manager(engine).snapshot(ws)  # stops them for its copy, and lets them go again
        async with snapshot_files(engine, snap) as frozen_tree:
            frozen_ticks = (frozen_tree / "work/ticks").stat().st_size
            while (host(ws) / "work/ticks").stat().st_size <= frozen_ticks:
                await asyncio.sleep(0.01)
            assert (frozen_tree / "work/ticks").read_bytes() == b"tick\n" * (frozen_ticks // 5)
        await handle.kill()
    assert not wait_no_process(tag)


async def test_a_snapshot_pauses_the_container_for_its_instant(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    async with open_backend(request, "container", tmp_path) as engine:
        ws = await engine.manager.create_workspace("fork/paused")
        spec = RunProgramSpec("/bin/sh", ["-c", "while :; do echo tick >> ticks; done"], timeout=120)
        async with await engine.runner.start_program(ws, spec) as handle:
            ticks = host(ws) / "work/ticks"
            while not ticks.exists():
                await asyncio.sleep(0.01)
            containers = engine.manager._containers  # type: ignore[attr-defined]
            cid = containers._ids[host(ws)]
            api = containers.client.api
            async with manager(engine)._frozen(ws):
                assert api.inspect_container(cid)["State"]["Paused"]
            assert not api.inspect_container(cid)["State"]["Paused"]
            since = time.time()
            snap = await manager(engine).snapshot(ws)
            actions = [
                e["Action"]
                for e in api.events(since=since, until=time.time() + 1, decode=True, filters={"container": cid})
            ]
            assert [a for a in actions if a in ("pause", "unpause")] == ["pause", "unpause"]
            async with snapshot_files(engine, snap) as frozen_tree:
                frozen_ticks = (frozen_tree / "work/ticks").stat().st_size
                assert (frozen_tree / "work/ticks").read_bytes() == b"tick\n" * (frozen_ticks // 5)
            while ticks.stat().st_size <= frozen_ticks:  # it runs on after the snapshot
                await asyncio.sleep(0.01)
            await handle.kill()


async def test_a_snapshot_pauses_the_member_a_runs_memory_limit_made_too(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A run with ``memory_bytes`` runs in a member container of its own cgroup: the snapshot holds it still too."""
    async with open_backend(request, "container", tmp_path) as engine:
        ws = await engine.manager.create_workspace("fork/member")
        limits = ResourceLimits(memory_bytes=64 << 20)
        spec = RunProgramSpec("/bin/sh", ["-c", "while :; do echo tick >> ticks; done"], timeout=120, limits=limits)
        async with await engine.runner.start_program(ws, spec) as handle:
            ticks = host(ws) / "work/ticks"
            while not ticks.exists():
                await asyncio.sleep(0.01)
            containers = engine.manager._containers  # type: ignore[attr-defined]
            ids, api = containers.workspace_ids(ws), containers.client.api
            assert len(ids) == 2  # the workspace's container and the member
            async with manager(engine)._frozen(ws):
                assert all(api.inspect_container(cid)["State"]["Paused"] for cid in ids)
                size = ticks.stat().st_size
                await asyncio.sleep(0.2)  # a bounded look: nothing may write while it is held
                assert ticks.stat().st_size == size
            assert not any(api.inspect_container(cid)["State"]["Paused"] for cid in ids)
            await handle.kill()


async def test_restore_brings_back_every_byte_mode_and_metadata(engine: execspace.BaseEngine) -> None:
    ws = await engine.manager.create_workspace("fork/restore")
    root = host(ws)
    (root / "work/bin").mkdir()
    (root / "work/bin/tool").write_bytes(os.urandom(70_000))
    os.chmod(root / "work/bin/tool", 0o750)
    (root / "work/secret").write_bytes(b"\0\1\2 binary")
    os.chmod(root / "work/secret", 0o600)
    (root / "work/ro").write_bytes(b"read only")
    os.chmod(root / "work/ro", 0o444)
    with open(root / "work/sparse", "wb") as f:
        f.truncate(64 * 1024 * 1024)
        f.write(b"head")
    os.symlink("bin/tool", root / "work/link")
    os.chmod(root / "work/bin", 0o750)
    owner = root.stat()
    for p in (root / "work").rglob("*"):  # as the sandbox's programs' own files (its uid, as root)
        os.chown(p, owner.st_uid, owner.st_gid, follow_symlinks=False)
    fs = engine.fs
    assert isinstance(fs, SupportsFileMetadata)
    kept = [await fs.write_metadata(ws, p, {"from": p}) for p in ("work/secret", "work/bin")]
    before = tree(root)
    snap = await manager(engine).snapshot(ws, name="clean")
    assert snap.workspace == ws.id and snap.name == "clean"
    assert snap.size < 16 * 1024 * 1024, "holes are kept as holes"
    await run(engine, ws, "echo changed > secret; rm -f ro; rm -rf bin; echo more > added")
    os.chmod(root / "work/sparse", 0o700)
    assert tree(root) != before
    await fs.write_metadata(ws, "work/secret", {})
    await manager(engine).restore(ws, "clean")
    assert tree(root) == before
    expected = [{"from": p} if k else {} for p, k in zip(("work/secret", "work/bin"), kept, strict=True)]
    assert await fs.read_metadata(ws, ["work/secret", "work/bin"]) == expected  # file metadata comes back too
    assert (root / "work/sparse").stat().st_blocks * 512 < 16 * 1024 * 1024
    # the restored workspace still works as itself: its programs write where they may
    assert await run(engine, ws, "cat secret; echo x > after; cat after") == "\0\1\2 binaryx\n"
    assert (await engine.fs.read_file(ws, "work/after")).content == b"x\n"


async def test_a_hundred_forks_of_one_workspace(engine: execspace.BaseEngine) -> None:
    ws = await engine.manager.create_workspace("fork/many")
    await engine.fs.put_files(ws, [PutFile(f"work/f{i}.txt", f"file {i}".encode()) for i in range(20)])
    snap = await manager(engine).snapshot(ws)
    forks = await manager(engine).fork(snap, count=100)
    assert len({f.id for f in forks}) == 100 and len({host(f) for f in forks}) == 100
    for i, fork in enumerate(forks):
        await engine.fs.put_files(fork, [PutFile("work/f0.txt", f"fork {i}".encode())])
    assert [(await engine.fs.read_file(f, "work/f0.txt")).content for f in forks] == [
        f"fork {i}".encode() for i in range(100)
    ]
    assert (await engine.fs.read_file(forks[57], "work/f19.txt")).content == b"file 19"
    assert (await engine.fs.read_file(ws, "work/f0.txt")).content == b"file 0"
    assert await run(engine, forks[99], "cat f0.txt f5.txt") == "fork 99file 5"
    ids = {s.id for s in stored_workspaces(manager(engine).root)}
    assert {f.id for f in forks} | {ws.id} == ids


async def test_removing_the_parent_and_its_snapshot_never_breaks_a_child(engine: execspace.BaseEngine) -> None:
    ws = await engine.manager.create_workspace("fork/gone")
    await engine.fs.put_files(ws, [PutFile("work/kept.txt", b"kept")])
    snap = await manager(engine).snapshot(ws, name="base")
    (child,) = await manager(engine).fork(snap, ids=["fork/child"])
    (grandchild,) = await manager(engine).fork(child)
    await engine.manager.cleanup(ws)
    await manager(engine).remove_snapshot(snap)
    assert not host(ws).exists() and await manager(engine).list_snapshots() == []
    for w in (child, grandchild):
        assert await run(engine, w, "cat kept.txt") == "kept"
    assert (await engine.manager.get_workspace("fork/child")).host_path == host(child)
    with pytest.raises(SnapshotNotFound, match="list_snapshots"):
        await manager(engine).fork("base")


async def test_snapshots_are_named_listed_sized_and_traced(engine: execspace.BaseEngine) -> None:
    ws = await engine.manager.create_workspace("fork/snaps")
    await engine.fs.put_files(ws, [PutFile("work/big", b"x" * 100_000)])
    first = await manager(engine).snapshot(ws, name="first")
    with pytest.raises(InvalidSpec, match="exists"):
        await manager(engine).snapshot(ws, name="first")
    with pytest.raises(InvalidSpec, match="snapshot name"):
        await manager(engine).snapshot(ws, name="../x")
    (fork,) = await manager(engine).fork(first)
    second = await manager(engine).snapshot(fork)
    assert second.parent == first.id and second.workspace == fork.id and second.name is None
    if os.path.ismount(host(ws)):  # copy-on-write: its tree moved under it whole, its own layer is small
        assert first.size < 100_000
    else:
        assert first.size >= 100_000
    assert [s.id for s in await manager(engine).list_snapshots()] == [first.id, second.id]
    with pytest.raises(InvalidSpec, match="exists"):
        await manager(engine).fork(ws, ids=[fork.id])
    with pytest.raises(InvalidSpec, match="count"):
        await manager(engine).fork(ws, count=101)
    await manager(engine).remove_snapshot("first")
    assert [s.id for s in await manager(engine).list_snapshots()] == [second.id]


_FORK_FOREVER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from execspace.workspace.hostmanager import HostWorkspaceManager

    async def main():
        root = Path(sys.argv[1])
        m = HostWorkspaceManager("local", root, copy_on_write=sys.argv[2] == "cow")
        ws = await m.get_workspace("kill/parent")
        while True:
            await m.fork(ws)

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("cow", [False, pytest.param(True, marks=cow_only)])
async def test_kill_9_mid_fork_leaves_no_half_made_workspace(tmp_path: Path, cow: bool) -> None:
    root = tmp_path / "ws"
    m = HostWorkspaceManager("local", root, copy_on_write=cow)
    ws = await m.create_workspace("kill/parent")
    for i in range(30):
        d = host(ws) / "work" / f"d{i}"
        d.mkdir()
        for j in range(100):
            (d / f"f{j}").write_bytes(b"y" * 1000)
    proc = subprocess.Popen([sys.executable, "-c", _FORK_FOREVER, str(root), "cow" if cow else "copy"])
    partials = root / SNAPSHOTS_DIR
    try:
        # killed while a copy is under way: a partial directory with files in it
        for _ in range(2000):
            if any(p.name.startswith(".partial-") and any(p.rglob("f*")) for p in partials.glob(".partial-*")):
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the forking process never started a copy")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    try:
        after = HostWorkspaceManager("local", root, copy_on_write=cow)
        listed = stored_workspaces(root)
        assert listed and all(not s.problem for s in listed)
        for s in listed:
            assert sum(1 for _ in (s.path / "work").rglob("f*")) == 3000, f"{s.id} is incomplete"
            assert (await after.get_workspace(s.id)).host_path == s.path
        # a fork moved into place but not yet mounted when the process died is complete: it is mounted on use
        for name in os.listdir(root / LAYERS_DIR) if (root / LAYERS_DIR).is_dir() else []:
            ws_dir = root / name
            fork_id = json.loads((ws_dir.parent / LAYERS_DIR / name / "upper/metadata.json").read_text())["id"]
            assert (await after.get_workspace(fork_id)).host_path == ws_dir
            assert sum(1 for _ in (ws_dir / "work").rglob("f*")) == 3000
        # the next store on this root removes what the killed process left
        await after.snapshot(ws)
        assert not list(partials.glob(".partial-*"))
    finally:
        unmount_forks(root)


# -- copy-on-write (root, overlayfs) -----------------------------------------------------------------


@pytest.fixture
def cow_engine(engine: execspace.BaseEngine) -> execspace.BaseEngine:
    if manager(engine).fork_mode != "cow":
        pytest.skip(f"{engine.name} forks by copies here ({'not root' if os.geteuid() else 'its manager copies'})")
    assert engine.describe().fork == "cow"
    return engine


async def test_a_fork_costs_its_changes_and_its_disk_limit_counts_only_them(cow_engine: execspace.BaseEngine) -> None:
    ws = await cow_engine.manager.create_workspace("cow/base")
    await cow_engine.fs.put_files(ws, [PutFile("work/big.bin", os.urandom(4 * 1024 * 1024))])
    snap = await manager(cow_engine).snapshot(ws)
    policy = execspace.WorkspacePolicy(max_disk_bytes=1024 * 1024)
    (fork,) = await manager(cow_engine).fork(snap, policy=policy)
    assert await cow_engine.fs.disk_usage(fork) < 256 * 1024  # type: ignore[attr-defined]
    small = await cow_engine.runner.run_program(fork, RunProgramSpec("sh", ["-c", "head -c 100000 big.bin > part"]))
    assert small.ok and small.limit_hit is None, small
    big = await cow_engine.runner.run_program(fork, RunProgramSpec("sh", ["-c", "cat big.bin > copy"]))
    assert big.limit_hit == "disk_bytes"
    # the parent's bytes were never copied into the fork: only what the fork wrote is its own
    upper = manager(cow_engine).root / LAYERS_DIR / host(fork).name / "upper"
    assert not (upper / "work/big.bin").exists() and (upper / "work/copy").exists()


@pytest.fixture
def unheld_engine(cow_engine: execspace.BaseEngine, request: pytest.FixtureRequest) -> execspace.BaseEngine:
    """A copy-on-write engine whose new workspaces nothing holds: a session-mode engine's may be a pooled session's
    from the start, and are copied (test_a_workspace_a_program_holds_is_copied_not_moved)."""
    if request.node.callspec.params["engine"] == "sandbox-session":
        pytest.skip("a pooled session may hold a new workspace from its creation")
    return cow_engine


def store_files(engine: execspace.BaseEngine, name: str) -> list[os.stat_result]:
    """Every regular file called ``name`` in the layers of the manager's snapshot store."""
    store = manager(engine).root / SNAPSHOTS_DIR
    return [p.lstat() for p in store.glob(f"snap-*/tree/**/{name}") if stat.S_ISREG(p.lstat().st_mode)]


async def test_a_live_fork_moves_a_plain_workspace_once_then_copies_only_changes(
    unheld_engine: execspace.BaseEngine,
) -> None:
    ws = await unheld_engine.manager.create_workspace("cow/live")
    await unheld_engine.fs.put_files(ws, [PutFile("work/big.bin", os.urandom(1 << 20)), PutFile("work/keep", b"k")])
    big = (host(ws) / "work/big.bin").stat()
    (first,) = await manager(unheld_engine).fork(ws)
    # moved whole, not copied: the store holds the parent's very file, and the parent is an overlay over it
    assert [(s.st_ino, s.st_size) for s in store_files(unheld_engine, "big.bin")] == [(big.st_ino, 1 << 20)]
    assert os.path.ismount(host(ws)) and not os.path.ismount(host(ws) / "work")
    assert await run(unheld_engine, ws, "echo -n changed > keep && cat keep") == "changed"
    (second,) = await manager(unheld_engine).fork(ws)
    snap = await manager(unheld_engine).snapshot(ws)
    # later ones copied only what changed (a few small files each), never the big one again
    assert len(store_files(unheld_engine, "big.bin")) == 1 and len(store_files(unheld_engine, "keep")) == 3
    assert snap.size < 100_000
    for fork, keep in ((first, "k"), (second, "changed")):
        assert (host(fork) / "work/keep").read_text() == keep
        assert (host(fork) / "work/big.bin").read_bytes() == (host(ws) / "work/big.bin").read_bytes()


async def test_a_workspace_a_program_holds_is_copied_not_moved(
    cow_engine: execspace.BaseEngine, request: pytest.FixtureRequest
) -> None:
    """A program holding the tree would go on writing it where it moved: the fork copies it, and the next fork
    after the program ended moves it."""
    ws = await cow_engine.manager.create_workspace("cow/held")
    await cow_engine.fs.put_files(ws, [PutFile("work/big.bin", os.urandom(1 << 20))])
    big = (host(ws) / "work/big.bin").stat()
    spec = RunProgramSpec("/bin/sh", ["-c", "echo started > started; exec sleep 60"], timeout=60)
    async with await cow_engine.runner.start_program(ws, spec) as handle:
        while not (host(ws) / "work/started").exists():
            await asyncio.sleep(0.01)
        (copied,) = await manager(cow_engine).fork(ws)
        assert not os.path.ismount(host(ws))
        (copy,) = store_files(cow_engine, "big.bin")  # the fork stands on a whole copy, not the parent's file
        assert copy.st_ino != big.st_ino and copy.st_size == big.st_size
        await handle.kill()
    (host(copied) / "work/started").unlink()
    if request.node.callspec.params["engine"] == "sandbox-session":
        (copied_again,) = await manager(cow_engine).fork(ws)  # its session outlives the program: it holds the tree
        assert not os.path.ismount(host(ws)) and (host(copied_again) / "work/started").exists()
        return
    (moved,) = await manager(cow_engine).fork(ws)
    assert os.path.ismount(host(ws)) and big.st_ino in {s.st_ino for s in store_files(cow_engine, "big.bin")}
    assert (host(moved) / "work/started").read_text() == "started\n"


@pytest.mark.parametrize("hold", ["working directory", "open file"])
async def test_a_workspace_a_host_process_holds_is_copied_not_moved(
    unheld_engine: execspace.BaseEngine, hold: str
) -> None:
    """A process the engine does not know (a shell, another engine's program) working in the tree or holding one of
    its files keeps it from moving; once it is gone, the next fork moves it."""
    ws = await unheld_engine.manager.create_workspace("cow/host-held")
    await unheld_engine.fs.put_files(ws, [PutFile("work/big.bin", os.urandom(1 << 20))])
    big = host(ws) / "work/big.bin"
    if hold == "working directory":
        holder = subprocess.Popen(["sleep", "60"], cwd=host(ws) / "work")
    else:
        holder = subprocess.Popen(["/bin/sh", "-c", f"exec sleep 60 3<'{big}'"], cwd="/")
    try:
        while Path(f"/proc/{holder.pid}/comm").read_text() != "sleep\n":  # the shell's redirect is made
            await asyncio.sleep(0.01)
        (copied,) = await manager(unheld_engine).fork(ws)
        assert not os.path.ismount(host(ws))
        (copy,) = store_files(unheld_engine, "big.bin")  # the fork stands on a whole copy, not the parent's file
        assert copy.st_ino != big.stat().st_ino
    finally:
        holder.kill()
        holder.wait()
    (moved,) = await manager(unheld_engine).fork(ws)
    assert os.path.ismount(host(ws))
    for fork in (copied, moved):
        assert (host(fork) / "work/big.bin").read_bytes() == big.read_bytes()


@pytest.mark.parametrize("plant", ["set-id bit", "device node"])
async def test_a_tree_a_copy_would_change_is_copied_not_moved(cow_engine: execspace.BaseEngine, plant: str) -> None:
    """What root planted in a workspace that a copy would not keep (a set-id bit, a device node) keeps the
    workspace from moving into the store: the fork copies, and the copy drops it, as every copy does."""
    ws = await cow_engine.manager.create_workspace("cow/planted")
    await cow_engine.fs.put_files(ws, [PutFile("work/tool", b"#!/bin/sh\n")])
    tool = host(ws) / "work/tool"
    if plant == "set-id bit":
        os.chmod(tool, 0o4755)
    else:
        os.mknod(host(ws) / "work/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    (fork,) = await manager(cow_engine).fork(ws)
    assert not os.path.ismount(host(ws)) and tool.stat().st_ino not in {
        s.st_ino for s in store_files(cow_engine, "tool")
    }
    assert not (host(fork) / "work/tool").stat().st_mode & stat.S_ISUID
    assert not (host(fork) / "work/null").exists()


async def test_layers_are_flattened_past_the_depth_limit(cow_engine: execspace.BaseEngine) -> None:
    ws = await cow_engine.manager.create_workspace("cow/deep")
    await cow_engine.fs.put_files(ws, [PutFile("work/n", b"0")])
    current = ws
    for depth in range(1, MAX_DEPTH + 2):
        snap = await manager(cow_engine).snapshot(current)
        chain = manager(cow_engine).branches.store.chain(snap)
        # the workspace's own tree is the bottom layer where the first snapshot moved it into the store (where
        # nothing held it: not a pooled session's workspace)
        below = 1 if os.path.ismount(host(ws)) else 0
        expected = depth + below if depth + below <= MAX_DEPTH else depth + below - MAX_DEPTH
        assert len(chain) == expected, (depth, chain)
        (current,) = await manager(cow_engine).fork(snap)
        await cow_engine.fs.put_files(current, [PutFile("work/n", str(depth).encode())])
        await cow_engine.fs.remove(current, "work/n") if depth == 3 else None
    assert await run(cow_engine, current, "cat n") == str(MAX_DEPTH + 1)


async def test_a_shared_layer_lives_until_its_last_fork_goes(cow_engine: execspace.BaseEngine) -> None:
    ws = await cow_engine.manager.create_workspace("cow/shared")
    await cow_engine.fs.put_files(ws, [PutFile("work/kept.txt", b"kept")])
    snap = await manager(cow_engine).snapshot(ws, name="base")
    forks = await manager(cow_engine).fork(snap, count=3)
    await manager(cow_engine).remove_snapshot("base")
    await cow_engine.manager.cleanup(ws)
    store = manager(cow_engine).branches.store
    assert await manager(cow_engine).list_snapshots() == [] and store.tree(snap.id).is_dir()
    for fork in forks[:2]:
        await cow_engine.manager.cleanup(fork)
        assert not os.path.ismount(host(fork)) and not host(fork).exists()
    assert await run(cow_engine, forks[2], "cat kept.txt") == "kept"
    await cow_engine.manager.cleanup(forks[2])
    assert not store.tree(snap.id).exists()  # nothing stands on it any more: freed
    assert not [n for n in os.listdir(store.dir) if not n.startswith(".")]


@pytest.mark.parametrize("mount_point", ["kept", "never made"])
async def test_a_fork_is_mounted_again_after_a_reboot(cow_engine: execspace.BaseEngine, mount_point: str) -> None:
    """After a reboot its mount is gone; a process killed between moving a fork's layers into place and mounting
    them left no mount point either. Either way nothing lists it, and the next manager mounts it whole."""
    ws = await cow_engine.manager.create_workspace("cow/reboot")
    await cow_engine.fs.put_files(ws, [PutFile("work/a", b"a")])
    (fork,) = await manager(cow_engine).fork(ws, ids=["cow/reboot-fork"])
    await cow_engine.fs.put_files(fork, [PutFile("work/b", b"b")])
    unmount(host(fork))
    if mount_point == "never made":
        host(fork).rmdir()
    assert "cow/reboot-fork" not in {s.id for s in stored_workspaces(manager(cow_engine).root)}
    fresh = HostWorkspaceManager(manager(cow_engine).backend, manager(cow_engine).root, copy_on_write=True)
    again = await fresh.get_workspace("cow/reboot-fork")
    assert (host(again) / "work/a").read_bytes() == b"a" and (host(again) / "work/b").read_bytes() == b"b"
    assert "cow/reboot-fork" in {s.id for s in stored_workspaces(manager(cow_engine).root)}


async def test_a_manager_that_copies_reads_a_layered_snapshot_whole(cow_engine: execspace.BaseEngine) -> None:
    """Two backends may share a root (local and jupyter do): one that forks by copies still gets every file of
    a snapshot another made as a layer, and none it deleted."""
    ws = await cow_engine.manager.create_workspace("cow/mixed")
    await cow_engine.fs.put_files(ws, [PutFile("work/base.txt", b"base"), PutFile("work/gone.txt", b"x")])
    (fork,) = await manager(cow_engine).fork(ws)
    await cow_engine.fs.put_files(fork, [PutFile("work/top.txt", b"top")])
    await cow_engine.fs.remove(fork, "work/gone.txt")
    layered = await manager(cow_engine).snapshot(fork, name="layered")
    # the parent's tree (where the fork moved it into the store), the parent's state when forked, the fork's changes
    chain = manager(cow_engine).branches.store.chain(layered)
    assert len(chain) == (3 if os.path.ismount(host(ws)) else 2)
    copier = HostWorkspaceManager("copies", manager(cow_engine).root)
    assert copier.fork_mode == "copy"
    (copy,) = await copier.fork("layered")
    work = host(copy) / "work"
    assert sorted(p.name for p in work.iterdir()) == ["base.txt", "inputs", "top.txt"]
    assert (work / "base.txt").read_bytes() == b"base" and (work / "top.txt").read_bytes() == b"top"
    await copier.restore(copy, layered)
    assert not (work / "gone.txt").exists() and (work / "top.txt").read_bytes() == b"top"
    assert not os.path.ismount(host(copy))
