"""Containers outlive no owner: interpreter exit removes them, and a crashed owner's are reaped on the next open.

The owners here are real subprocesses that open an engine and run programs; one is SIGKILLed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from execspace.backends.container.daemon import connect
from execspace.backends.container.reaper import (
    LABEL,
    Owner,
    current_owner,
    owner_alive,
    owner_labels,
    reap_orphans,
)
from execspace.workspace.layout import sanitize_id
from execspace.workspace.slots import SLOT_PREFIX
from tests.backends.container_support import container_engine, engine_containers
from tests.backends.docker_fixture import TEST_BINDS, Daemon

pytest.importorskip("docker", reason="the docker SDK is not installed (pip install 'execspace[docker]')")

# opens an engine (pool of 1), runs in two workspaces, reports its pid and engine, then waits or exits
_OWNER = """
import asyncio, json, sys
from execspace.backends.container import ContainerBackend, ContainerOptions
from execspace import RunProgramSpec

async def main(host, image, root, binds, then):
    eng = await ContainerBackend.open(ContainerOptions(image=image, docker_host=host, workspace_root=root,
                                      read_only_binds=json.loads(binds), pool_size=1,
                                      watchdog=then.endswith("watchdog")))
    for name in ("a", "b"):
        ws = await eng.manager.create_workspace(name)
        r = await eng.runner.run_program(ws, RunProgramSpec("true"))
        assert r.exit_code == 0, r
    await eng.pool.ready()
    print(json.dumps({"engine": eng.engine_id}), flush=True)
    if then.startswith("wait"):
        await asyncio.sleep(600)
    # "exit": leave without closing the engine; atexit must clean up

asyncio.run(main(*sys.argv[1:]))
"""


def _start_owner(daemon: Daemon, image: str, root: Path, then: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _OWNER, daemon.host, image, str(root), json.dumps(TEST_BINDS), then],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"the owner process failed (exit {proc.wait()})"
    return proc, json.loads(line)["engine"]


async def test_a_killed_owners_containers_are_reaped_on_open(
    docker_daemon: Daemon, test_image: str, tmp_path: Path
) -> None:
    root = tmp_path / "ws"
    proc, engine_id = _start_owner(docker_daemon, test_image, root, "wait")
    try:
        assert len(engine_containers(docker_daemon, engine_id)) == 3  # two workspaces and the refilled pool slot
        # the owner is alive: neither an explicit reap nor another engine's open touches its containers
        client = connect(docker_daemon.host)
        try:
            assert reap_orphans(client, root) == []
        finally:
            client.close()
        async with container_engine(docker_daemon, test_image, root, pool_size=0):
            pass
        assert len(engine_containers(docker_daemon, engine_id)) == 3
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert len(engine_containers(docker_daemon, engine_id)) == 3  # SIGKILL ran no clean-up
    assert len(list(root.glob(f"{SLOT_PREFIX}*"))) == 1
    async with container_engine(docker_daemon, test_image, root, pool_size=0):
        assert engine_containers(docker_daemon, engine_id) == {}
        assert list(root.glob(f"{SLOT_PREFIX}*")) == []  # the unused slot's directory went with it
        assert sorted(os.listdir(root)) == sorted(sanitize_id(n) for n in "ab")  # workspaces stay on disk


def test_the_watchdog_cleans_up_right_after_a_sigkill(docker_daemon: Daemon, test_image: str, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    proc, engine_id = _start_owner(docker_daemon, test_image, root, "wait-watchdog")
    try:
        assert len(engine_containers(docker_daemon, engine_id)) == 3
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    deadline = time.monotonic() + 20  # the watchdog connects and removes three containers
    while engine_containers(docker_daemon, engine_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert engine_containers(docker_daemon, engine_id) == {}  # no engine was opened to reap them
    assert list(root.glob(f"{SLOT_PREFIX}*")) == []


async def test_closing_the_engine_ends_its_watchdog(docker_daemon: Daemon, test_image: str, tmp_path: Path) -> None:
    async with container_engine(docker_daemon, test_image, tmp_path, watchdog=True) as eng:
        pid = eng.watchdog_pid
        assert isinstance(pid, int) and Path(f"/proc/{pid}").exists()
        engine_id = eng.engine_id
        await eng.pool.ready()
    assert not Path(f"/proc/{pid}").exists()  # waited for: not even a zombie is left
    assert engine_containers(docker_daemon, engine_id) == {}


def test_interpreter_exit_removes_an_unclosed_engines_containers(
    docker_daemon: Daemon, test_image: str, tmp_path: Path
) -> None:
    root = tmp_path / "ws"
    proc, engine_id = _start_owner(docker_daemon, test_image, root, "exit")
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert engine_containers(docker_daemon, engine_id) == {}
    assert list(root.glob(f"{SLOT_PREFIX}*")) == []


def test_owner_liveness_is_judged_only_where_it_can_be() -> None:
    here = current_owner()
    assert owner_alive(here, here) is True
    # the same pid with another start time is a reused pid: its owner is dead
    assert owner_alive(Owner(here.pid, str(int(here.start) + 1), here.host, here.boot, here.pidns), here) is False
    assert owner_alive(Owner(here.pid, here.start, here.host, "another-boot", here.pidns), here) is False
    # another host or pid namespace: a pid means nothing here, so the container stays
    assert owner_alive(Owner(here.pid + 1, "1", "elsewhere", here.boot, here.pidns), here) is None
    assert owner_alive(Owner(here.pid + 1, "1", here.host, here.boot, "pid:[1]"), here) is None
    assert Owner.from_fields(LABEL, {LABEL: "1"}) is None  # unlabelled by this version: never reaped
    assert Owner.from_fields(LABEL, owner_labels(here, "e1")) == here
