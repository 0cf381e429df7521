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


async def test_links_planted_in_a_branch_never_reach_outside_it(engine: execspace.BaseEngine, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("host secret")
    os.chmod(victim, 0o600)
    before = (victim.stat().st_mtime_ns, Path("/etc/passwd").stat().st_mtime_ns)
    parent = await engine.manager.create_workspace("red/fork-parent")
    assert (await sh(engine, parent, SS_PLANT)).ok
    if os.geteuid() == 0:
        # a hard link to a file the program does not own (as if it could make one): never copied, never read
        os.link(victim, host(parent) / "work" / "victim_hard")
    snap = await manager(engine).snapshot(parent, name="planted")
    branch, sibling = await manager(engine).fork(snap, count=2)
    for tree in (snap.path, host(branch)):
        work = tree / "work"
        assert os.readlink(work / "abs_link") == "/etc/passwd" and os.readlink(work / "deep/loop") == ".."
        assert not (work / "victim_hard").exists()
        assert (work / "own").read_text() == (work / "own_hard").read_text() == "mine\n"
        assert "host secret" not in {p.read_text() for p in work.rglob("*") if p.is_file() and not p.is_symlink()}
    # the host's file API refuses to go through them, reading or writing
    for path in ("work/abs_link", "work/climb/passwd", "work/deep/loop/own"):
        with pytest.raises(PathDenied):
            await engine.fs.read_file(branch, path)
    with pytest.raises(PathDenied):
        await engine.fs.put_files(branch, [PutFile("work/climb/evil", b"x")])
    await engine.fs.put_files(branch, [PutFile("work/abs_link", b"replaced, not written through")])
    assert os.readlink(host(sibling) / "work/abs_link") == "/etc/passwd"
    # the branch's program rewrites every file it can reach and swaps links in; nothing outside it changes
    frozen, sibling_view = digest(snap.path), digest(host(sibling))
    hostile = (
        "for f in own own_hard shared.txt; do echo branch > $f; done; rm -f shared.txt; "
        "ln -sf /workspace/../../.. own; mkdir -p d && ln -s / d/root; echo x > /workspace/out/o"
    )
    assert (await sh(engine, branch, hostile)).exit_code == 0
    await manager(engine).snapshot(branch, name="hostile")
    (again,) = await manager(engine).fork("hostile")
    await manager(engine).restore(branch, "planted")
    assert digest(snap.path) == frozen and digest(host(sibling)) == sibling_view
    assert (host(parent) / "work/shared.txt").read_text() == "parent\n"
    assert os.readlink(host(again) / "work/own").startswith("/workspace")
    assert victim.read_text() == "host secret"
    assert (victim.stat().st_mtime_ns, Path("/etc/passwd").stat().st_mtime_ns) == before


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
    for snap_tree in (root / ".snapshots").glob("snap-*/tree"):
        assert (snap_tree / "work/base.txt").read_bytes() == b"base"
