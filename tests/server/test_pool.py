"""The warm pool of ``execspace serve`` (``--pool-size``), through the official SDK: a create takes a sandbox made
ahead (its workspace on the host before the create was sent), with what the create asked for; pooled sandboxes
are isolated from each other, the pool refills within ``--max-sandboxes``, and a stopped server leaves none."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox
from e2b.exceptions import RateLimitException

from .conftest import Server, running_server

pytestmark = pytest.mark.timeout(180)


@pytest.fixture()
def pooled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    with running_server(tmp_path / "ws", "--pool-size", "3", "--max-sandboxes", "5") as server:
        for name, value in server.sdk_env().items():
            monkeypatch.setenv(name, value)
        wait_for_pool(server, ready=3)
        yield server


def pool_status(server: Server) -> dict[str, dict[str, int]]:
    answer = httpx.get(f"{server.url}/execspace/pool", headers={"X-API-KEY": server.key})
    answer.raise_for_status()
    status: dict[str, dict[str, int]] = answer.json()
    return status


def wait_for_pool(server: Server, *, ready: int, template: str = "base", within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while (now := pool_status(server)[template]["ready"]) != ready:
        assert time.monotonic() < deadline, f"the {template} pool holds {now} ready sandboxes, not {ready}"
        time.sleep(0.05)


def workspace_dirs(server: Server) -> dict[str, Path]:
    """The sandboxes' workspace directories on the host (``e2b_<id>-...``), by sandbox id."""
    return {p.name.split("_", 1)[1].split("-", 1)[0]: p for p in server.root.iterdir() if p.name.startswith("e2b_")}


def test_a_create_takes_a_ready_sandbox_with_what_it_asked_for(pooled: Server) -> None:
    made_ahead = workspace_dirs(pooled)
    assert len(made_ahead) == 3
    sbx = Sandbox.create(metadata={"team": "a"}, envs={"GREETING": "hello"}, timeout=120)
    try:
        assert sbx.sandbox_id in made_ahead, "the sandbox was made before its create"
        info = sbx.get_info()
        assert info.metadata == {"team": "a"}
        assert 100 < (info.end_at - info.started_at).total_seconds() <= 120
        assert sbx.commands.run("echo $GREETING").stdout == "hello\n"
        sbx.files.write("note.txt", "pooled")
        assert (made_ahead[sbx.sandbox_id] / "work" / "note.txt").read_text() == "pooled"
    finally:
        sbx.kill()
    assert not made_ahead[sbx.sandbox_id].exists(), "kill removed the taken sandbox's workspace"


def test_pooled_sandboxes_see_neither_files_nor_processes_of_each_other(pooled: Server) -> None:
    first, second = Sandbox.create(), Sandbox.create()
    try:
        assert {first.sandbox_id, second.sandbox_id} <= set(workspace_dirs(pooled))
        first.files.write("secret.txt", "first's")
        first.commands.run("sleep 613", background=True)
        assert first.commands.run("ps -eo args").stdout.count("sleep 613") == 1
        assert not second.files.exists("secret.txt")
        assert "sleep 613" not in second.commands.run("ps -eo args").stdout
        seen = second.commands.run(f"ls {pooled.root} 2>&1; true").stdout
        assert first.sandbox_id not in seen
    finally:
        first.kill()
        second.kill()


def test_the_pool_refills_within_the_server_maximum(pooled: Server) -> None:
    taken = [Sandbox.create() for _ in range(3)]
    wait_for_pool(pooled, ready=2)  # 3 live of 5: room for 2
    assert pool_status(pooled)["base"] == {"size": 3, "target": 2, "ready": 2, "kernels": 0, "taken": 3, "missed": 0}
    assert len(workspace_dirs(pooled)) == 5
    taken += [Sandbox.create(), Sandbox.create()]
    wait_for_pool(pooled, ready=0)
    with pytest.raises(RateLimitException):
        Sandbox.create()
    assert len(workspace_dirs(pooled)) == 5, "a full server holds no more sandboxes than its maximum"
    for sbx in taken[:4]:
        sbx.kill()
    wait_for_pool(pooled, ready=3)
    assert len(workspace_dirs(pooled)) == 4


async def test_concurrent_async_creates_beyond_the_pool_all_succeed(pooled: Server) -> None:
    """Five creates at once on a pool of three: three are taken, two made cold, each a sandbox of its own."""
    sandboxes = await asyncio.gather(*(AsyncSandbox.create(envs={"N": str(i)}) for i in range(5)))
    try:
        counts = pool_status(pooled)["base"]
        assert (counts["taken"], counts["missed"]) == (3, 2)
        outputs = await asyncio.gather(*(s.commands.run("echo $N") for s in sandboxes))
        assert [o.stdout for o in outputs] == [f"{i}\n" for i in range(5)]
        assert len({s.sandbox_id for s in sandboxes}) == 5
    finally:
        await asyncio.gather(*(s.kill() for s in sandboxes))


def _descendants(root: int) -> dict[int, str]:
    """``root``'s descendants with their start times (a pid reused meanwhile is another process)."""
    stats: dict[int, tuple[int, str]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(name)] = (int(fields[1]), fields[19])
    found: dict[int, str] = {}
    frontier = {root}
    while frontier:
        frontier = {pid for pid, (parent, _) in stats.items() if parent in frontier}
        found.update((pid, stats[pid][1]) for pid in frontier)
    return found


def _is_kernel(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"IPKernelApp" in f.read()  # the kernels' launcher (backends/jupyter/programkernel.py)
    except OSError:
        return False


def _alive(pid: int, started: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19] == started
    except OSError:
        return False


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_server_leaves_no_pooled_sandbox(tmp_path: Path, how: int) -> None:
    pools = ("--pool-size", "3", "--pool-size", "code-interpreter-v1=1")  # the latter with its warm kernel
    with running_server(tmp_path / "ws", *pools) as server:
        wait_for_pool(server, ready=3)
        deadline = time.monotonic() + 60
        while pool_status(server)["code-interpreter-v1"]["kernels"] < 1:
            assert time.monotonic() < deadline, "the pooled code-interpreter sandbox got no warm kernel"
            time.sleep(0.05)
        started = _descendants(server.process.pid)
        assert len(started) >= 4, "each pooled sandbox runs its session"
        assert any(_is_kernel(pid) for pid in started), "the warm kernel runs in its pooled sandbox's session"
        server.process.send_signal(how)
        server.process.wait(timeout=20)
    deadline = time.monotonic() + 10
    while left := [pid for pid, at in started.items() if _alive(pid, at)]:
        assert time.monotonic() < deadline, f"processes of the pool outlived the server: {left}"
        time.sleep(0.05)
    if how != signal.SIGKILL:  # a killed server removes nothing; its sessions are gone all the same
        # the machine's seeds stay: shared by the servers on this root, the next one's sandboxes start on them
        assert not [p for p in (tmp_path / "ws").rglob("*") if p.is_file() and ".machine-seeds" not in p.parts]
