"""``execspace ws``: list, rm and gc of the workspaces left on this host, never touching anything else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import execspace
from execspace import RunProgramSpec
from tests.support import CLI

pytestmark = pytest.mark.asyncio


def ws_cli(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "EXECSPACE_DAEMON": "off"}
    return subprocess.run(
        [sys.executable, "-m", "execspace", "ws", "--root", str(root), "--json", *args],
        capture_output=True,
        env=env,
        timeout=60,
    )


async def make_workspaces(root: Path, ids: list[str]) -> list[Path]:
    async with execspace.open_engine("local", workspace_root=root) as engine:
        made = []
        for ws_id in ids:
            ws = await engine.manager.create_workspace(ws_id)
            await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", "echo x > ../out/o.txt"]))
            assert ws.host_path is not None
            made.append(ws.host_path)
        return made


async def test_list_rm_and_gc_touch_only_workspaces(tmp_path: Path) -> None:
    root = tmp_path / "root"
    old, recent = await make_workspaces(root, ["app/old", "app/recent"])
    stray = root / "not-a-workspace"
    stray.mkdir()
    (stray / "keep.txt").write_text("mine")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("x")
    (old / "work" / "link").symlink_to(outside)  # a link in a workspace is removed, never followed
    (root / "linked").symlink_to(old)  # a link at the root is not a workspace
    week_ago = time.time() - 7 * 86400
    record = json.loads((old / "metadata.json").read_text())
    (old / "metadata.json").write_text(json.dumps({**record, "created_at": week_ago, "updated_at": week_ago}))
    for entry in ("", "runs", "work", "out", "metadata.json"):
        os.utime(old / entry, (week_ago, week_ago), follow_symlinks=False)
    listed = json.loads(ws_cli(root, "list").stdout)["workspaces"]
    assert [(w["id"], w["path"]) for w in listed] == [("app/old", str(old)), ("app/recent", str(recent))]
    # last used a week ago by its record and by its directories' times: only that one goes
    dry = json.loads(ws_cli(root, "gc", "--older-than", "1d", "--dry-run").stdout)
    assert [w["path"] for w in dry["would_remove"]] == [str(old)] and old.exists()
    gone = json.loads(ws_cli(root, "gc", "--older-than", "1d").stdout)
    assert [w["path"] for w in gone["removed"]] == [str(old)]
    assert not old.exists() and recent.exists() and (outside / "precious").read_text() == "x"
    assert (stray / "keep.txt").read_text() == "mine" and (root / "linked").is_symlink()
    by_id = json.loads(ws_cli(root, "rm", "app/recent").stdout)
    assert [w["path"] for w in by_id["removed"]] == [str(recent)] and not recent.exists()


async def test_rm_refuses_what_is_not_a_workspace_and_says_how_to_find_them(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (ws,) = await make_workspaces(root, ["a"])
    for target in (str(tmp_path), str(root / "nope"), "no-such-id"):
        proc = ws_cli(root, "rm", target)
        assert proc.returncode == 125 and b"execspace ws list" in proc.stderr, proc.stderr
    assert ws.exists()


async def test_snapshot_fork_and_restore_from_the_cli(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (ws,) = await make_workspaces(root, ["cli/branch"])
    (ws / "work" / "state.txt").write_text("v1")
    snap = json.loads(ws_cli(root, "snapshot", "cli/branch", "--name", "v1").stdout)["snapshot"]
    assert snap["name"] == "v1" and snap["workspace"] == "cli/branch" and snap["size"] > 0
    (ws / "work" / "state.txt").write_text("v2")
    forked = json.loads(ws_cli(root, "fork", "v1", "--id", "cli/a", "--id", "cli/b", "--count", "2").stdout)
    try:
        assert [f["id"] for f in forked["forks"]] == ["cli/a", "cli/b"]
        assert all(Path(f["path"], "work", "state.txt").read_text() == "v1" for f in forked["forks"])
        live = json.loads(ws_cli(root, "fork", str(ws)).stdout)["forks"]
        assert Path(live[0]["path"], "work", "state.txt").read_text() == "v2"
        assert json.loads(ws_cli(root, "restore", "cli/branch", "v1").stdout)["restored"] == str(ws)
        assert (ws / "work" / "state.txt").read_text() == "v1"
        listed = json.loads(ws_cli(root, "snapshots").stdout)["snapshots"]
        assert [s["name"] for s in listed] == ["v1"]
        missing = ws_cli(root, "fork", "nope")
        assert missing.returncode == 125 and b"execspace ws snapshots" in missing.stderr, missing.stderr
    finally:
        for f in json.loads(ws_cli(root, "list").stdout)["workspaces"]:
            ws_cli(root, "rm", f["path"])
    assert json.loads(ws_cli(root, "list").stdout)["workspaces"] == []


async def test_a_users_directory_keeps_its_mode_and_owner_through_snapshot_fork_restore_and_rm(
    tmp_path: Path,
) -> None:
    """What the red team did: ``execspace ws snapshot`` of a ``--workspace DIR`` made DIR's parent (a directory of
    the user's, named as the root) 0700. The parent and DIR keep their modes and owners through every verb, and
    the parent's own entries are untouched (the snapshots' store and the forks asked for are added beside)."""
    parent = tmp_path / "projects"
    parent.mkdir()
    (parent / "notes.txt").write_text("mine")
    ws_dir = parent / "proj"
    env = {**os.environ, "EXECSPACE_DAEMON": "off"}
    made = subprocess.run(
        [*CLI, "run", "--backend", "local", "--workspace", str(ws_dir), "--", "sh", "-c", "echo v1 > state.txt"],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    os.chmod(parent, 0o751)
    os.chmod(ws_dir, 0o750)

    def looks() -> list[tuple[int, int, int]]:
        return [(st.st_mode, st.st_uid, st.st_gid) for st in (parent.stat(), ws_dir.stat())]

    before = looks()
    assert json.loads(ws_cli(parent, "snapshot", str(ws_dir), "--name", "v1").stdout)["snapshot"]["name"] == "v1"
    assert looks() == before
    (ws_dir / "work" / "state.txt").write_text("v2")
    (fork,) = json.loads(ws_cli(parent, "fork", str(ws_dir), "--id", "mine/f1").stdout)["forks"]
    assert Path(fork["path"], "work", "state.txt").read_text() == "v2"
    assert looks() == before
    assert json.loads(ws_cli(parent, "restore", str(ws_dir), "v1").stdout)["restored"] == str(ws_dir)
    assert (ws_dir / "work" / "state.txt").read_text() == "v1\n"
    assert looks() == before
    assert ws_cli(parent, "rm", fork["path"]).returncode == 0
    assert looks() == before
    assert {p.name for p in parent.iterdir()} <= {"notes.txt", "proj", ".snapshots", ".layers"}
    assert (parent / "notes.txt").read_text() == "mine"
    assert ws_cli(parent, "rm", str(ws_dir)).returncode == 0
    assert not ws_dir.exists() and (parent.stat().st_mode, parent.stat().st_uid) == before[0][:2]


async def test_show_tells_size_runs_and_outputs_without_following_links(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (ws,) = await make_workspaces(root, ["app/shown"])
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("x" * 10000)
    (ws / "out" / "link").symlink_to(outside)
    (shown,) = json.loads(ws_cli(root, "show", "app/shown").stdout)["workspaces"]
    assert shown["path"] == str(ws) and shown["id"] == "app/shown"
    assert shown["runs"] == 1 and shown["outputs"] == ["out/o.txt"]  # the link is not followed, not an output
    assert 0 < shown["disk_bytes"] < 1 << 20
    missing = ws_cli(root, "show", "no/such")
    assert missing.returncode == 125 and b"execspace ws list" in missing.stderr
