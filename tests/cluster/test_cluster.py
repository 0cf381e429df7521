"""serve --ray through the official SDK: sandboxes spread over the nodes of a local Ray cluster, reachable through
any front door (a restarted one too), listed with their node, refused with 429 when every node is full, gone from
every node once killed or expired; files, ptys and the code interpreter's plots streamed through a front door."""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import CommandExitException, Sandbox
from e2b.exceptions import NotFoundException, RateLimitException, ServiceBusyException

from tests.support import until

from .conftest import PER_NODE, FrontDoor, LocalCluster, client_id, sleepers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def door(local_cluster: LocalCluster) -> Iterator[FrontDoor]:
    with local_cluster.front_door() as front:
        yield front


def test_sandboxes_spread_over_the_nodes_and_answer_through_either_front_door(
    local_cluster: LocalCluster, door: FrontDoor
) -> None:
    boxes = [Sandbox.create(timeout=120, **door.sdk()) for _ in range(6)]
    try:
        nodes = {b.sandbox_id: client_id(door, b.sandbox_id) for b in boxes}
        assert set(nodes.values()) <= local_cluster.node_ids() and len(set(nodes.values())) == 3, nodes
        with local_cluster.front_door() as other:
            for i, box in enumerate(boxes):
                there = Sandbox.connect(box.sandbox_id, **other.sdk())
                there.files.write("/home/user/n.txt", f"box {i}")
                assert there.commands.run("cat /home/user/n.txt", timeout=30).stdout == f"box {i}"
                there.commands.run("sleep 86391", background=True)
            until("each sandbox runs its marked program", lambda: len(sleepers(86391)) == len(boxes))
            listed = {s.sandbox_id: s for s in Sandbox.list(**other.sdk()).next_items()}
            assert set(listed) == set(nodes)
            pages, paged = Sandbox.list(limit=4, **other.sdk()), []
            while pages.has_next:  # pages cut across the nodes' lists: each sandbox once
                paged += [s.sandbox_id for s in pages.next_items()]
            assert sorted(paged) == sorted(nodes)
            assert {i: client_id(other, i) for i in nodes} == nodes
    finally:
        for box in boxes:
            box.kill()
    assert Sandbox.list(**door.sdk()).next_items() == []
    until("the programs of the killed sandboxes ended, on every node", lambda: not sleepers(86391))


def test_a_restarted_front_door_reaches_the_sandboxes_of_the_one_before(local_cluster: LocalCluster) -> None:
    with local_cluster.front_door() as first:
        box = Sandbox.create(timeout=120, **first.sdk())
        box.commands.run("echo kept > /home/user/kept.txt")
        box.commands.run("sleep 86392", background=True)
        until("the sandbox runs its marked program", lambda: sleepers(86392))
    try:
        with local_cluster.front_door() as second:
            again = Sandbox.connect(box.sandbox_id, **second.sdk())
            assert again.commands.run("cat /home/user/kept.txt").stdout == "kept\n"
            again.kill()
    finally:
        until("the sandbox's program ended", lambda: not sleepers(86392))


def test_a_full_cluster_answers_429_and_takes_creates_again_once_one_ends(door: FrontDoor) -> None:
    boxes = [Sandbox.create(timeout=120, **door.sdk()) for _ in range(3 * PER_NODE)]
    for box in boxes:
        box.commands.run("sleep 86393", background=True)
    until("each sandbox runs its marked program", lambda: len(sleepers(86393)) == len(boxes))
    try:
        with pytest.raises(RateLimitException):
            Sandbox.create(timeout=120, **door.sdk())
        boxes.pop().kill()
        until("the registry saw the slot free", lambda: _creates(door), within=20)
    finally:
        for box in boxes:
            box.kill()
        for box in Sandbox.list(**door.sdk()).next_items():
            Sandbox.kill(box.sandbox_id, **door.sdk())
    until("the programs of the killed sandboxes ended, on every node", lambda: not sleepers(86393))


def _creates(door: FrontDoor) -> bool:
    try:
        Sandbox.create(timeout=120, **door.sdk())
    except RateLimitException:
        return False
    return True


def _peak_rss(pid: int) -> int:
    """The most memory the process ever held resident (``VmHWM``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def test_fifty_megabytes_each_way_stream_through_the_front_door(door: FrontDoor) -> None:
    box = Sandbox.create(timeout=120, **door.sdk())
    try:
        data = os.urandom(50 * 1024 * 1024)
        before = _peak_rss(door.process.pid)
        box.files.write("/home/user/big.bin", io.BytesIO(data))
        streamed = hashlib.sha256()
        for chunk in box.files.read("/home/user/big.bin", format="stream"):
            streamed.update(chunk)
        assert streamed.digest() == hashlib.sha256(data).digest()
        gzipped = box.files.read("/home/user/big.bin", format="bytes", gzip=True)
        assert hashlib.sha256(gzipped).digest() == hashlib.sha256(data).digest()
        # neither body was held whole by the front door: its peak grew by far less than one of them
        assert _peak_rss(door.process.pid) - before < 20 * 1024 * 1024
    finally:
        box.kill()


def test_a_pty_and_a_plot_through_the_front_door(door: FrontDoor) -> None:
    pytest.importorskip("e2b_code_interpreter", reason="the code interpreter's SDK (pip install 'execspace[dev]')")
    pytest.importorskip("matplotlib", reason="the plot is matplotlib's (pip install 'execspace[dev]')")
    import e2b_code_interpreter as ci
    from e2b.sandbox.commands.command_handle import PtySize

    box = ci.Sandbox.create(timeout=120, **door.sdk())
    try:
        terminal = box.pty.create(PtySize(rows=24, cols=80))
        box.pty.send_stdin(terminal.pid, b"stty size; test -t 0 && echo on-a-tty; exit 7\n")
        received: list[bytes] = []
        with pytest.raises(CommandExitException) as ended:
            terminal.wait(on_pty=received.append)
        assert ended.value.exit_code == 7 and b"24 80\r\n" in b"".join(received)
        execution = box.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()")
        assert execution.error is None, execution.error
        pngs = [r.png for r in execution.results if r.png]
        assert len(pngs) == 1 and base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n")
    finally:
        box.kill()


def test_an_expired_sandbox_leaves_its_node_and_the_lists(door: FrontDoor) -> None:
    box = Sandbox.create(timeout=3, **door.sdk())
    box.commands.run("sleep 86395", background=True)
    until("the sandbox runs its marked program", lambda: sleepers(86395))
    until("the sandbox expired on its node", lambda: not sleepers(86395), within=30)
    with pytest.raises(NotFoundException):
        Sandbox.connect(box.sandbox_id, **door.sdk())
    assert box.sandbox_id not in {s.sandbox_id for s in Sandbox.list(**door.sdk()).next_items()}


def test_forks_and_snapshots_stay_on_their_sandboxs_node(door: FrontDoor) -> None:
    source = Sandbox.create(timeout=120, **door.sdk())
    made: list[Sandbox] = []
    try:
        source.files.write("/home/user/state.txt", "step 1")
        node = client_id(door, source.sandbox_id)
        made += [f for f in source.fork() if isinstance(f, Sandbox)]  # on a node of PER_NODE slots: 4 in all
        snapshot = source.create_snapshot(name="saved")
        made += [Sandbox.create(key, timeout=60, **door.sdk()) for key in (snapshot.snapshot_id, "saved")]
        assert len(made) == 3
        for box in made:
            assert client_id(door, box.sandbox_id) == node
            assert box.files.read("/home/user/state.txt") == "step 1"
        listed = Sandbox.list_snapshots(sandbox_id=source.sandbox_id, **door.sdk()).next_items()
        assert [s.snapshot_id for s in listed] == [snapshot.snapshot_id]
        Sandbox.delete_snapshot(snapshot.snapshot_id, **door.sdk())
    finally:
        for box in [source, *made]:
            box.kill()


def test_a_front_door_stops_at_once_with_streams_open_and_their_sandbox_lives_on(
    local_cluster: LocalCluster, door: FrontDoor
) -> None:
    with local_cluster.front_door() as leaving, concurrent.futures.ThreadPoolExecutor(1) as pool:
        box = Sandbox.create(timeout=120, **leaving.sdk())
        running = box.commands.run("sleep 86396", background=True)
        waiting = pool.submit(running.wait)  # reads the command's stream through the front door
        until("the command runs", lambda: sleepers(86396))
        leaving.process.terminate()
        leaving.process.wait(timeout=10)  # not held by the open stream
        assert waiting.exception(timeout=10) is not None  # its reader was cut, not left hanging
    try:
        assert sleepers(86396)  # the sandbox is the node's, not the front door's
        again = Sandbox.connect(box.sandbox_id, **door.sdk())
        assert running.pid in [p.pid for p in again.commands.list()]
    finally:
        Sandbox.kill(box.sandbox_id, **door.sdk())
    until("the killed sandbox's program ended", lambda: not sleepers(86396))


def test_a_front_door_with_other_keys_is_refused_by_the_agents_naming_the_fix(
    local_cluster: LocalCluster, door: FrontDoor
) -> None:
    Sandbox.list(**door.sdk()).next_items()  # every node's agent is up, with this door's keys
    with local_cluster.front_door(key="e2b_" + "f" * 40) as other, pytest.raises(ServiceBusyException) as refused:
        Sandbox.create(timeout=60, **other.sdk())
    assert "serves other API keys than this front door" in str(refused.value)  # 503: retried by clients
    assert "same --api-key" in str(refused.value)


async def test_the_e2b_backend_runs_forks_and_snapshots_through_a_front_door(door: FrontDoor) -> None:
    """The library path to a cluster: ``open_engine("e2b")`` pointed at a front door, as at one host."""
    import execspace
    from execspace import PutFile, RunProgramSpec

    connection = {"api_url": door.url, "sandbox_url": door.url, "api_key": door.key}
    async with execspace.open_engine("e2b", **connection, template="base", kill_grace=1.0) as engine:
        ws = await engine.manager.create_workspace("prepared")
        await engine.fs.put_files(ws, [PutFile("work/state.txt", b"prepared\n")])
        (fork,) = await engine.manager.fork(ws, 1)
        snap = await engine.manager.snapshot(ws, "prepared-state")
        (started,) = await engine.manager.fork(snap, 1)
        for each in (ws, fork, started):
            done = await engine.runner.run_program(each, RunProgramSpec("cat", ["state.txt"], cwd="work"))
            assert (done.exit_code, done.stdout) == (0, "prepared\n")
        for each in (started, fork, ws):
            await engine.manager.cleanup(each)
        await engine.manager.remove_snapshot(snap.id)
    assert Sandbox.list(**door.sdk()).next_items() == []
