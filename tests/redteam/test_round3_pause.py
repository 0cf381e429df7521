"""Round 3 of the red team: a freeze (a pause of ``execspace serve``, a snapshot's copy) holds a tree that fights
it. The program's children wake each other with ``SIGCONT`` in a loop, or fork continuously; the host then
watches, over a bounded window, that none of them runs (their CPU time and the tick counters they write stand
still), also after it wakes them itself. As root the cgroup freezer holds them; unprivileged, signals either hold
them too or the freeze fails with ``FreezeFailed`` and the tree runs on, intact. Attacks end by themselves."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import textwrap
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest

import execspace
from execspace import FreezeFailed, PutFile, RunProgramSpec, Workspace
from execspace.registry import probe_backend
from execspace.testing.processes import new_tag, pids_with, tagged, wait_no_process
from tests.support import held_still, make_traversable

pytestmark = pytest.mark.timeout(180)

#: Children that fight a freeze until ``seconds`` have passed: ``wake`` sends SIGCONT to the whole process group in a
#: loop (a sibling stopped before it is woken again), ``fork`` forks a short-lived child over and over. Each writes
#: how often it went round into ``<prefix>tick.<i>``.
ATTACK = textwrap.dedent(
    """
    import os, signal, sys, time
    mode, n, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    prefix = sys.argv[4] if len(sys.argv) > 4 else ""
    end = time.monotonic() + seconds
    for i in range(n):
        if os.fork() == 0:
            fd = os.open(f"{prefix}tick.{i}", os.O_WRONLY | os.O_CREAT, 0o644)
            k = 0
            while time.monotonic() < end:
                k += 1
                if mode == "wake":
                    os.killpg(0, signal.SIGCONT)
                elif os.fork() == 0:
                    os._exit(0)
                else:
                    os.wait()
                if k % 20 == 0:
                    os.pwrite(fd, b"%12d" % k, 0)
            os._exit(0)
    for _ in range(n):
        os.wait()
    """
)
CHILDREN = 6
#: How long the host watches a held tree for any progress.
WINDOW = 1.5


@pytest.fixture
async def engine(sandbox_mode: Mapping[str, object], tmp_path: Path) -> AsyncIterator[execspace.BaseEngine]:
    probe = await probe_backend("sandbox")
    if not probe.ok:
        pytest.skip(f"no sandbox here: {probe.reason}")
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", **sandbox_mode) as eng:
        yield eng


def cgroup_freezer(engine: execspace.BaseEngine) -> bool:
    return engine.describe().details["freeze"].startswith("cgroup freezer")


def cpu_ticks(tag: str) -> dict[int, int]:
    """Every tagged process's CPU time so far (user and system, in clock ticks)."""
    found = {}
    for pid in pids_with(tag):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[pid] = int(fields[11]) + int(fields[12])
    return found


def ticks(work: Path, prefix: str = "") -> list[bytes]:
    """What each child's counter says (``b""`` before it wrote one)."""
    files = [work / f"{prefix}tick.{i}" for i in range(CHILDREN)]
    return [f.read_bytes() if f.exists() else b"" for f in files]


def all_ticking(work: Path, prefix: str = "", within: float = 20.0) -> None:
    """Poll until every child went round again since this was called (bounded). Blocking: the attack runs on
    without the engine's loop."""
    first = ticks(work, prefix)
    deadline = time.monotonic() + within
    while any(a == b for a, b in zip(ticks(work, prefix), first, strict=True)):
        assert time.monotonic() < deadline, f"not every child runs: {first} then {ticks(work, prefix)}"
        time.sleep(0.05)


def stopped_states(tag: str) -> list[str]:
    states = []
    for pid in pids_with(tag):
        with contextlib.suppress(OSError):
            states.append(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0])
    return [s for s in states if s in ("T", "t")]


def nothing_runs(tag: str, work: Path, prefix: str = "") -> None:
    """Over :data:`WINDOW`, polled: no tagged process gains CPU time, no counter moves, no process is born."""
    cpu, counted = cpu_ticks(tag), ticks(work, prefix)
    assert cpu, "the attack's processes are gone"
    deadline = time.monotonic() + WINDOW
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = cpu_ticks(tag)
        assert set(now) <= set(cpu), f"new processes while held: {set(now) - set(cpu)}"
        moved = {pid: (cpu[pid], t) for pid, t in now.items() if t != cpu[pid]}
        assert not moved, f"processes ran while held (pid: CPU ticks before, after): {moved}"
        assert ticks(work, prefix) == counted, "a child went round while held"


def settle_after_wake(tag: str, within: float = 15.0) -> None:
    """Poll until three samples 50 ms apart find the same CPU times: whatever was woken is held again (the watcher
    has no deadline once the hold stands; on a loaded machine a tree that wakes itself takes a few passes)."""
    deadline = time.monotonic() + within
    samples = [cpu_ticks(tag)]
    while len(samples) < 3 or not samples[-1] == samples[-2] == samples[-3]:
        assert time.monotonic() < deadline, "what the host woke was not held again"
        time.sleep(0.05)
        samples.append(cpu_ticks(tag))


async def start_attack(engine: execspace.BaseEngine, ws: Workspace, mode: str, tag: str) -> execspace.ProgramHandle:
    await engine.fs.put_files(ws, [PutFile("work/attack.py", ATTACK)])
    spec = RunProgramSpec("python3", ["attack.py", mode, str(CHILDREN), "60"], env=tagged(tag), timeout=90)
    return await engine.runner.start_program(ws, spec)


@pytest.mark.parametrize("mode", ["wake", "fork"])
async def test_a_tree_that_fights_the_freeze_is_held_or_the_freeze_fails(
    engine: execspace.BaseEngine, mode: str
) -> None:
    assert isinstance(engine.runner, execspace.SupportsFreezing)
    ws = await engine.manager.create_workspace(f"red/pause-{mode}")
    assert ws.host_path is not None
    work, tag = ws.host_path / "work", new_tag(f"pause-{mode}")
    handle = await start_attack(engine, ws, mode, tag)
    try:
        all_ticking(work)
        try:
            async with engine.runner.frozen(ws):
                if cgroup_freezer(engine):  # the kernel holds them, not a stop signal
                    assert all(held_still(pid) for pid in pids_with(tag)) and stopped_states(tag) == []
                nothing_runs(tag, work)
                # woken from outside the tree (as any process of the uid could): held again, and stays so
                for pid in pids_with(tag):
                    os.kill(pid, signal.SIGCONT)
                settle_after_wake(tag)
                nothing_runs(tag, work)
        except FreezeFailed as exc:
            assert not cgroup_freezer(engine), f"the cgroup freezer did not hold the tree: {exc}"
            assert "could not all be stopped" in str(exc)
        # continued (or never held): every child runs on, nothing is left stopped
        all_ticking(work)
        assert stopped_states(tag) == []
        assert not handle.finished
    finally:
        await handle.kill()
        await asyncio.wait_for(handle.wait(), 15)  # its supervision over: nothing of it is left to the next test
    assert wait_no_process(tag, within=15) == []


async def test_the_freeze_is_the_cgroup_freezer_as_root(engine: execspace.BaseEngine) -> None:
    """As root the kernel's freezer holds the sandbox, never signals alone (they cannot hold a tree whose
    processes wake each other); unprivileged, Capabilities says signals hold it and a pause may fail."""
    detail = engine.describe().details["freeze"]
    if os.geteuid() == 0 and Path("/sys/fs/cgroup/freezer").is_dir():
        assert cgroup_freezer(engine), detail
    elif os.geteuid() != 0:
        assert "SIGSTOP" in detail and "FreezeFailed" in detail, detail


async def test_a_hundred_freezes_of_a_tree_that_fights_each_hold_or_fail(engine: execspace.BaseEngine) -> None:
    """The race, many times over: a hold begun while the children wake each other (each round at another moment
    of their loop) either holds every one of them, or fails and leaves them all running; never a hold with one
    left running, never a child left stopped after."""
    ws = await engine.manager.create_workspace("red/pause-rounds")
    assert ws.host_path is not None
    work, tag = ws.host_path / "work", new_tag("pause-rounds")
    handle = await start_attack(engine, ws, "wake", tag)
    held = failed = 0
    try:
        all_ticking(work)
        for _ in range(100):
            try:
                async with engine.runner.frozen(ws):
                    before = cpu_ticks(tag)
                    await asyncio.sleep(0.03)  # a window for one left running to show itself
                    assert cpu_ticks(tag) == before, "a child ran while the hold stood"
                held += 1
            except FreezeFailed:
                assert not cgroup_freezer(engine), "the cgroup freezer did not hold the tree"
                failed += 1
            assert stopped_states(tag) == [], "a child was left stopped after the hold"
        assert held + failed == 100 and held > 0
        all_ticking(work)  # every child runs on after the last round
    finally:
        await handle.kill()
        await asyncio.wait_for(handle.wait(), 15)
    assert wait_no_process(tag, within=15) == []
