"""Holding process trees still by signals (:class:`StoppedTree`): every process of the tree is stopped when the block
runs, also one that the kernel schedules only rarely (a loaded machine; here a CPU quota makes it so); one woken
while held is stopped again; a tree that cannot be held fails the freeze and runs on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from execspace.errors import FreezeFailed
from execspace.process.freezing import StoppedTree, held

_CPU_V1 = Path("/sys/fs/cgroup/cpu")


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _throttled(group: Path) -> int:
    """How many times the group's processes were held back for the rest of a period."""
    stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
    return int(stat["nr_throttled"])


@pytest.fixture
def starved_cgroup() -> Iterator[Path]:
    """A cgroup whose processes get 1 ms of CPU per second: a stop sent to one of them lands only when the kernel
    next runs it, up to a second later, as on a machine much busier than this one."""
    if os.geteuid() != 0 or not (_CPU_V1 / "cpu.cfs_quota_us").exists():
        pytest.skip("needs root and the cgroup v1 cpu controller (the machines this project runs on have both)")
    group = _CPU_V1 / f"execspace-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("1000000")
        (group / "cpu.cfs_quota_us").write_text("1000")
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            (_CPU_V1 / "cgroup.procs").write_text(pid)
        group.rmdir()


async def test_a_process_scheduled_rarely_is_stopped_before_the_block_runs(starved_cgroup: Path) -> None:
    busy = subprocess.Popen(["/bin/sh", "-c", "while :; do :; done"])
    try:
        (starved_cgroup / "cgroup.procs").write_text(str(busy.pid))
        while _throttled(starved_cgroup) < 2:  # it spins, throttled: runnable, but run 1 ms a second
            await asyncio.sleep(0.01)
        assert _state(busy.pid) == "R"
        async with held([StoppedTree([busy.pid])]):
            assert _state(busy.pid) == "T"
        while _state(busy.pid) == "T":  # continued: polled, as SIGCONT lands asynchronously
            await asyncio.sleep(0.01)
    finally:
        busy.kill()
        busy.wait()


def _spinning(children: int) -> subprocess.Popen[bytes]:
    """A shell whose ``children`` spin; in a session of its own, killed whole by the test."""
    loops = " ".join(["(while :; do :; done) &"] * children)
    return subprocess.Popen(["/bin/sh", "-c", f"{loops} wait"], start_new_session=True)


def _tree(pid: int) -> list[int]:
    found, pending = [], [pid]
    while pending:
        found.append(p := pending.pop())
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p}/task"):
                pending += [int(c) for c in Path(f"/proc/{p}/task/{tid}/children").read_text().split()]
    return found


async def _until(what: str, check: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {within} s"
        await asyncio.sleep(0.005)


@pytest.fixture
def spinning() -> Iterator[subprocess.Popen[bytes]]:
    proc = _spinning(3)
    try:
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def test_a_process_woken_while_held_is_stopped_again(spinning: subprocess.Popen[bytes]) -> None:
    await _until("the children started", lambda: len(_tree(spinning.pid)) == 4)
    async with held([StoppedTree([spinning.pid])]):
        pids = _tree(spinning.pid)
        assert {_state(p) for p in pids} == {"T"}
        for _ in range(20):  # woken from outside the tree, over and over: stopped again each time
            os.killpg(spinning.pid, signal.SIGCONT)
            await _until("the woken ones stopped again", lambda: {_state(p) for p in pids} == {"T"})
    await _until("everything continued", lambda: "T" not in {_state(p) for p in pids})


async def test_a_tree_woken_without_end_fails_the_freeze_and_runs_on(spinning: subprocess.Popen[bytes]) -> None:
    await _until("the children started", lambda: len(_tree(spinning.pid)) == 4)
    pids = _tree(spinning.pid)
    # three processes outside the tree wake it as fast as they can (until it is gone)
    wake = f"while kill -CONT -{spinning.pid} 2>/dev/null; do :; done"
    wakers = [subprocess.Popen(["/bin/sh", "-c", wake]) for _ in range(3)]
    try:
        with pytest.raises(FreezeFailed, match=r"could not all be stopped within 5 s \(\d+ process"):
            async with held([StoppedTree([spinning.pid])]):
                pytest.fail("the block ran while the tree was being woken")
    finally:
        for waker in wakers:
            waker.kill()
            waker.wait()
    assert _tree(spinning.pid) == pids  # intact
    await _until("everything continued", lambda: "T" not in {_state(p) for p in pids})


async def test_a_freeze_of_nothing_holds_at_once() -> None:
    async with held([]), held([StoppedTree([])]):
        pass
