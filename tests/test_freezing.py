"""Stopping process trees for a snapshot's instant: every process of the tree is stopped when the block runs, also
one that the kernel schedules only rarely (a loaded machine; here a CPU quota makes it so)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from execspace.process.freezing import stopped_trees

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
        async with stopped_trees([busy.pid]):
            assert _state(busy.pid) == "T"
        while _state(busy.pid) == "T":  # continued: polled, as SIGCONT lands asynchronously
            await asyncio.sleep(0.01)
    finally:
        busy.kill()
        busy.wait()
