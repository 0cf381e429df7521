"""The per-workspace sandbox uid: derived from the workspace directory itself, and taken over on upgrade."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import execspace
from execspace import RunProgramSpec
from execspace.backends.sandbox.bwrap import is_sandbox_uid, sandbox_uid
from execspace.registry import probe_backend
from tests.support import make_traversable


def test_uid_follows_the_directory_not_its_path(tmp_path: Path) -> None:
    first = tmp_path / "slot"
    first.mkdir()
    uid = sandbox_uid(first)
    assert is_sandbox_uid(uid) and not is_sandbox_uid(0) and not is_sandbox_uid(65534)
    moved = tmp_path / "workspace"
    first.rename(moved)
    assert sandbox_uid(moved) == uid  # a pool slot renamed into place keeps the uid its sandbox runs as
    first.mkdir()
    assert sandbox_uid(first) != uid  # a new directory at the old path is another workspace


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="per-workspace uids are used only as root")
async def test_a_workspace_laid_out_for_another_uid_is_taken_over(tmp_path: Path) -> None:
    probe = await probe_backend("sandbox")
    if not probe.ok:
        pytest.skip(f"no sandbox here: {probe.reason}")
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws") as engine:
        ws = await engine.manager.create_workspace("upgrade/session")
        assert ws.host_path is not None
        assert (await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", "echo v1 > ../out/f.txt"]))).ok
    uid = sandbox_uid(ws.host_path)
    old = uid + 1 if is_sandbox_uid(uid + 1) else uid - 1  # what an older derivation (from the path) gave it
    outside = tmp_path / "outside.txt"
    outside.write_text("not the workspace's")
    os.chown(outside, old, old)
    (ws.host_path / "work" / "link").symlink_to(outside)
    for top, dirs, files in os.walk(ws.host_path):
        for name in (top, *(os.path.join(top, n) for n in (*dirs, *files))):
            os.chown(name, old, old, follow_symlinks=False)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws") as engine:
        ws = await engine.manager.create_workspace("upgrade/session")
        result = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", "echo v2 >> ../out/f.txt"]))
    assert result.ok, result.stderr
    assert (ws.host_path / "out" / "f.txt").read_text() == "v1\nv2\n"
    owners = {p.lstat().st_uid for p in ws.host_path.rglob("*")}
    assert owners == {uid}, owners  # every entry, the symlink itself included
    assert outside.stat().st_uid == old  # never through the link
