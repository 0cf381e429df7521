"""Snapshots and forks of a workspace whose program is hostile: what it plants in a branch (symlinks out, hard
links to files it does not own, a swap of its files while the host copies) never makes the host read or write
outside the branch, and never reaches the parent, a sibling or the frozen snapshot."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest

import execspace
from execspace import PathDenied, PutFile, RunProgramSpec, Workspace
from execspace.registry import probe_backend
from tests.support import make_traversable
from tests.workspace.test_fork import host, manager, unmount_forks

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
async def engine(sandbox_mode: Mapping[str, object], tmp_path: Path) -> AsyncIterator[execspace.BaseEngine]:
    probe = await probe_backend("sandbox")
    if not probe.ok:
        pytest.skip(f"no sandbox here: {probe.reason}")
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", **sandbox_mode) as eng:
        try:
            yield eng
        finally:
            unmount_forks(tmp_path / "ws")


async def sh(engine: execspace.BaseEngine, ws: Workspace, script: str) -> execspace.RunResult:
    return await engine.runner.run_program(ws, RunProgramSpec("/bin/sh", ["-c", script], timeout=30))


def digest(root: Path) -> dict[str, str]:
    """What every entry under ``root`` is, links not followed: its kind and bytes (a link's target text)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            p = Path(dirpath, name)
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[str(p.relative_to(root))] = "link:" + os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


SS_PLANT = """
ln -s /etc/passwd abs_link
ln -s ../../../../../../../../../../etc climb
mkdir deep && ln -s .. deep/loop
echo mine > own && ln own own_hard
echo parent > shared.txt
"""


async def test_links_planted_in_a_branch_never_reach_outside_it(engine: execspace.BaseEngine) -> None:
    before = Path("/etc/passwd").stat().st_mtime_ns
    parent = await engine.manager.create_workspace("red/fork-parent")
    assert (await sh(engine, parent, SS_PLANT)).ok
    snap = await manager(engine).snapshot(parent, name="planted")
    branch, sibling, view = await manager(engine).fork(snap, count=3)
    for tree in (host(view), host(branch)):  # a fork is how a snapshot's files are read (its path: its layer)
        work = tree / "work"
        assert os.readlink(work / "abs_link") == "/etc/passwd" and os.readlink(work / "deep/loop") == ".."
        assert (work / "own").read_text() == (work / "own_hard").read_text() == "mine\n"
    # the host's file API refuses to go through them, reading or writing
    for path in ("work/abs_link", "work/climb/passwd", "work/deep/loop/own"):
        with pytest.raises(PathDenied):
            await engine.fs.read_file(branch, path)
    with pytest.raises(PathDenied):
        await engine.fs.put_files(branch, [PutFile("work/climb/evil", b"x")])
    await engine.fs.put_files(branch, [PutFile("work/abs_link", b"replaced, not written through")])
    assert os.readlink(host(sibling) / "work/abs_link") == "/etc/passwd"
    # the branch's program rewrites every file it can reach and swaps links in; nothing outside it changes
    frozen, sibling_view = digest(host(view) / "work"), digest(host(sibling) / "work")
    hostile = (
        "for f in own own_hard shared.txt; do echo branch > $f; done; rm -f shared.txt; "
        "ln -sf /workspace/../../.. own; mkdir -p d && ln -s / d/root; echo x > /workspace/out/o"
    )
    assert (await sh(engine, branch, hostile)).exit_code == 0
    await manager(engine).snapshot(branch, name="hostile")
    (again,) = await manager(engine).fork("hostile")
    await manager(engine).restore(branch, "planted")
    (later,) = await manager(engine).fork("planted")
    assert digest(host(view) / "work") == digest(host(later) / "work") == frozen
    assert digest(host(sibling) / "work") == sibling_view
    assert (host(parent) / "work/shared.txt").read_text() == "parent\n"
    assert os.readlink(host(again) / "work/own").startswith("/workspace")
    assert Path("/etc/passwd").stat().st_mtime_ns == before


def inodes_under(root: Path) -> set[tuple[int, int]]:
    """The (device, inode) of every regular file under ``root``, links not followed."""
    found = set()
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                found.add((st.st_dev, st.st_ino))
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a hard link to another user's file takes root")
async def test_a_hard_link_out_of_a_workspace_never_reaches_a_snapshot_or_fork(
    engine: execspace.BaseEngine, sandbox_mode: Mapping[str, object], tmp_path: Path
) -> None:
    """A live workspace's first fork may move its tree into the snapshot store whole, not copy it: a tree with a
    hard link to a file outside it (as if the program could make one) is copied instead, and the copy drops the
    link, so the outside file's bytes are in no snapshot and no fork."""
    victim = tmp_path / "victim.txt"
    victim.write_text("host secret")
    os.chmod(victim, 0o600)
    parent = await engine.manager.create_workspace("red/fork-hard-link")
    assert (await sh(engine, parent, SS_PLANT)).ok
    planted = host(parent) / "work" / "victim_hard"
    os.link(victim, planted)
    (live,) = await manager(engine).fork(parent)
    snap = await manager(engine).snapshot(parent, name="linked")
    (branch,) = await manager(engine).fork(snap)
    victim_id = (victim.stat().st_dev, victim.stat().st_ino)
    assert victim_id not in inodes_under(manager(engine).root / ".snapshots")
    # the parent's tree stayed where it was (copied, not moved), the link still in it
    assert not os.path.ismount(host(parent)) and os.path.samefile(planted, victim)
    for ws in (live, branch):
        work = host(ws) / "work"
        assert not (work / "victim_hard").exists() and (work / "own_hard").read_text() == "mine\n"
        assert "host secret" not in {p.read_text() for p in work.rglob("*") if p.is_file() and not p.is_symlink()}
        result = await sh(engine, ws, "cat victim_hard; echo x > victim_hard")
        assert "host secret" not in result.stdout
    assert victim.read_text() == "host secret"
    # without it, the same tree moves (as root, where nothing runs in it: in session mode its session holds it)
    os.unlink(planted)
    (moved,) = await manager(engine).fork(parent)
    assert (host(moved) / "work/own").read_text() == "mine\n"
    held = sandbox_mode.get("mode") == "session"
    assert os.path.ismount(host(parent)) == (manager(engine).fork_mode == "cow" and not held)
    assert victim_id not in inodes_under(manager(engine).root / ".snapshots") and victim.stat().st_nlink == 1


async def test_a_branch_cannot_reach_the_layers_it_stands_on(engine: execspace.BaseEngine) -> None:
    parent = await engine.manager.create_workspace("red/fork-layers")
    await engine.fs.put_files(parent, [PutFile("work/base.txt", b"base")])
    (branch,) = await manager(engine).fork(parent)
    root = manager(engine).root
    probe = (
        f"ls -a / /workspace; cat {root}/.snapshots/*/tree/work/base.txt {root}/.layers/*/upper/metadata.json; "
        f"echo x > {root}/.layers/x; echo hacked > /workspace/work/base.txt; cat /workspace/work/base.txt"
    )
    result = await sh(engine, branch, probe)
    assert ".snapshots" not in result.stdout and ".layers" not in result.stdout
    assert result.stdout.rstrip().endswith("hacked")
    assert (host(parent) / "work/base.txt").read_bytes() == b"base"
    assert not (root / ".layers" / "x").exists()
    # every layer that holds the file kept it (copy-on-write: the parent's tree, moved into the store by the fork;
    # a normal user's fork is a copy, with no layer in the store)
    kept = [t / "work/base.txt" for t in (root / ".snapshots").glob("snap-*/tree") if (t / "work/base.txt").exists()]
    assert all(p.read_bytes() == b"base" for p in kept) and (kept or manager(engine).fork_mode == "copy")
    (again,) = await manager(engine).fork(parent)
    assert (host(again) / "work/base.txt").read_bytes() == b"base"
