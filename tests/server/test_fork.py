"""``POST /sandboxes/{id}/fork`` and snapshots through the official SDK: each fork (or sandbox made from a
snapshot) starts with the source's files (never its processes), and what one changes is its own."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox
from e2b.exceptions import NotFoundException, RateLimitException, SandboxException

from .conftest import Server, running_server


def test_forks_start_with_the_files_and_keep_their_changes(e2b_server: Server) -> None:
    source = Sandbox.create(metadata={"owner": "me"}, timeout=120)
    forks: list[Sandbox] = []
    try:
        source.files.write("state/step.txt", "step 1\n")
        source.commands.run("sleep 60", background=True)
        results = source.fork(count=3)
        forks = [f for f in results if isinstance(f, Sandbox)]
        assert len(forks) == 3, results
        assert len({f.sandbox_id for f in forks} | {source.sandbox_id}) == 4
        for i, fork in enumerate(forks):
            assert fork.files.read("state/step.txt") == "step 1\n"
            assert fork.get_info().metadata == {"owner": "me"}
            assert "sleep 60" not in fork.commands.run("ps -eo args").stdout  # processes are not forked
            fork.files.write("state/step.txt", f"fork {i}\n")
            fork.commands.run("rm -rf state && echo gone > only-here")
        assert source.files.read("state/step.txt") == "step 1\n" and not source.files.exists("only-here")
        assert "sleep 60" in source.commands.run("ps -eo args").stdout  # the source kept running
        assert [f.files.read("only-here") for f in forks] == ["gone\n"] * 3
    finally:
        for sbx in [source, *forks]:
            sbx.kill()
    with pytest.raises(NotFoundException):
        Sandbox.fork(source.sandbox_id)


async def test_fork_through_the_async_sdk() -> None:
    source = await AsyncSandbox.create(timeout=60)
    try:
        await source.files.write("a.txt", "from the source")
        (fork,) = await source.fork()
        assert isinstance(fork, AsyncSandbox)
        assert (await fork.commands.run("cat a.txt")).stdout == "from the source"
        await fork.kill()
    finally:
        await source.kill()


def test_forks_count_against_the_servers_maximum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_server(tmp_path / "ws", "--max-sandboxes", "3") as server:
        for name, value in server.sdk_env().items():
            monkeypatch.setenv(name, value)
        source = Sandbox.create()
        with pytest.raises(RateLimitException, match="max-sandboxes"):
            source.fork(count=3)
        assert [s.sandbox_id for s in Sandbox.list().next_items()] == [source.sandbox_id]  # none was made
        assert len(source.fork(count=2)) == 2
        with httpx.Client(base_url=server.url, headers={"X-API-KEY": server.key}) as http:
            bad = http.post(f"/sandboxes/{source.sandbox_id}/fork", json={"count": 0})
        assert bad.status_code == 400 and "count" in bad.json()["message"]


def test_snapshots_list_and_start_sandboxes() -> None:
    source = Sandbox.create(timeout=120)
    started: list[Sandbox] = []
    try:
        source.files.write("state.txt", "saved")
        info = source.create_snapshot(name="saved-state")
        assert info.names == ["saved-state"] and info.snapshot_id.startswith("snap-")
        source.files.write("state.txt", "changed later")
        listed = Sandbox.list_snapshots(sandbox_id=source.sandbox_id).next_items()
        assert [s.snapshot_id for s in listed] == [info.snapshot_id]
        for key in (info.snapshot_id, "saved-state"):
            started.append(Sandbox.create(key, timeout=60))
            assert started[-1].files.read("state.txt") == "saved"
        with pytest.raises(SandboxException, match="memory"):
            source.create_snapshot(mode="full")  # asked for by name: refused (left unset, files only)
        assert source.create_snapshot(mode="filesystem").names == []
    finally:
        for sbx in [source, *started]:
            sbx.kill()
    with pytest.raises(Exception, match="templateID"):
        Sandbox.create("no-such-snapshot")


def test_a_tree_deeper_than_a_snapshot_copies_is_refused_with_the_limit(e2b_server: Server) -> None:
    """What the red team did: snapshot (and fork) a sandbox holding a tree deeper than the copy's walk goes. The
    answer is E2B's JSON error, 422, naming the limit and what to do (was a 500); nothing is kept, the sandbox
    runs on and, once the deep part is gone, snapshots."""
    source = Sandbox.create(timeout=120)
    try:
        made = source.commands.run("mkdir -p $(python3 -c \"print('/'.join(['d'] * 300))\") && echo made")
        assert made.stdout == "made\n"
        before = {s.snapshot_id for s in Sandbox.list_snapshots().next_items()}
        headers = {"X-API-KEY": e2b_server.key}
        for verb in ("snapshots", "fork"):
            answer = httpx.post(f"{e2b_server.url}/sandboxes/{source.sandbox_id}/{verb}", json={}, headers=headers)
            assert answer.status_code == 422, answer.text
            body = answer.json()
            assert body["code"] == 422 and "more than 256 directories deep" in body["message"], body
            assert "flatten the deep part" in body["message"]
        with pytest.raises(SandboxException, match=r"422.*256 directories deep"):
            source.create_snapshot()
        assert {s.snapshot_id for s in Sandbox.list_snapshots().next_items()} == before
        assert not [p for p in (e2b_server.root / ".snapshots").glob(".partial-*")]
        source.commands.run("rm -rf d")
        assert source.create_snapshot().snapshot_id.startswith("snap-")
    finally:
        source.kill()


def test_a_snapshot_is_deleted_as_a_template(e2b_server: Server) -> None:
    source = Sandbox.create(timeout=120)
    try:
        source.files.write("state.txt", "saved")
        info = source.create_snapshot(name="to-delete")
        made = Sandbox.create(info.snapshot_id, timeout=60)
        answer = httpx.get(f"{e2b_server.url}/snapshots", headers={"X-API-KEY": e2b_server.key})
        assert answer.headers["x-execspace-fork"] in ("cow", "copy")  # the e2b backend's sign to fork here
        assert Sandbox.delete_snapshot(info.snapshot_id)
        assert info.snapshot_id not in [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
        assert made.files.read("state.txt") == "saved"  # what was created from it stands on its own
        assert not Sandbox.delete_snapshot(info.snapshot_id)  # 404: gone
        assert not Sandbox.delete_snapshot("base")  # a template: never deleted
        made.kill()
    finally:
        source.kill()
