"""Per-run cgroups: limits hold for the whole process tree, and hits are reported; the freezer holds a tree still,
whatever its processes do (cgroup v1's freezer controller and v2's ``cgroup.freeze``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from execspace import ResourceLimits
from execspace.backends.sandbox.cgroups import BWRAP_HELPER_PIDS, CgroupSupport, RunCgroup, _Base
from execspace.errors import FreezeFailed
from execspace.process.freezing import held
from tests.support import held_still

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups are Linux only")


@pytest.fixture(scope="module")
def support() -> CgroupSupport:
    s = CgroupSupport.detect()
    if not s.enforced:
        pytest.skip("no cgroup controller we may create groups in (needs root or a delegated v2 subtree)")
    return s


def run_in(group_join, code: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return subprocess.run(
        [sys.executable, "-c", code], preexec_fn=group_join, capture_output=True, text=True, timeout=60
    )


def test_nothing_requested_needs_a_group_only_for_the_freezer_and_the_cpu_count(support: CgroupSupport) -> None:
    group = support.create(ResourceLimits())
    if not support.freezes:
        assert group is None
        return
    assert group is not None
    try:
        assert group.enforces() == frozenset()
        assert set(group.paths) - {"cpuacct"} == {"freezer"}  # v1's accounting controller, where it is mounted
    finally:
        group.remove()


def test_the_cpu_clock_counts_what_the_groups_processes_use(support: CgroupSupport) -> None:
    """The group's count, children included: it stands still while they wait and grows while they compute (a
    second of a busy child's own CPU time, which exits before it is read: no walk of live processes would see it)."""
    group = support.create(ResourceLimits())
    if group is None:
        pytest.skip("no cgroup here")
    try:
        waiting = run_in(group.join_fn(), "import time; time.sleep(0.5)")
        assert waiting.returncode == 0
        before = group.cpu_clock([])
        assert run_in(group.join_fn(), "import time; time.sleep(0.5)").returncode == 0
        after_waiting = group.cpu_clock([])
        code = "import os, time\nif os.fork() == 0:\n  while time.process_time() < 1: pass\n  os._exit(0)\nos.wait()"
        assert run_in(group.join_fn(), code).returncode == 0
        after_computing = group.cpu_clock([])
    finally:
        group.remove()
    assert after_waiting - before < 0.5  # a Python start-up, nothing more
    assert after_computing - after_waiting > 0.8
    assert group.cpu_clock([]) == 0  # removed: the tree under no root has used nothing


def test_memory_limit_covers_children_and_is_reported(support: CgroupSupport) -> None:
    if "memory_bytes" not in support.enforced:
        pytest.skip("memory controller unavailable")
    group = support.create(ResourceLimits(memory_bytes=64 << 20))
    assert group is not None
    try:
        # each child stays under 64 MiB alone; together they exceed it: only a group limit sees that
        code = (
            "import multiprocessing as mp, time\n"
            "def hog(_):\n    b = bytearray(40 << 20)\n    b[::4096] = b'x' * len(b[::4096])\n    time.sleep(2)\n"
            "ps = [mp.Process(target=hog, args=(i,)) for i in range(3)]\n"
            "[p.start() for p in ps]; [p.join() for p in ps]\n"
            "print([p.exitcode for p in ps])\n"
        )
        proc = run_in(group.join_fn(), code)
        assert "-9" in proc.stdout or proc.returncode != 0
        assert group.limit_hit() == "memory_bytes"
    finally:
        group.remove()
    assert not any(p.exists() for p in group.paths.values())


@contextlib.contextmanager
def limited(support: CgroupSupport, name: str, limits: ResourceLimits) -> Iterator[RunCgroup]:
    """A group with ``limits``, removed after the block; the test skips where ``name`` is not enforced here."""
    if name not in support.enforced:
        pytest.skip(f"no cgroup controller for {name} here")
    group = support.create(limits)
    assert group is not None
    try:
        yield group
    finally:
        group.remove()


def test_pids_limit_is_per_group(support: CgroupSupport) -> None:
    with limited(support, "pids", ResourceLimits(pids=10)) as group:
        code = (
            "import subprocess\nok = 0\n"
            "ps = []\n"
            "for _ in range(40):\n"
            "    try:\n        ps.append(subprocess.Popen(['sleep', '2'])); ok += 1\n"
            "    except OSError:\n        pass\n"
            "[p.wait() for p in ps]\nprint(ok)\n"
        )
        proc = run_in(group.join_fn(), code)
        started = int(proc.stdout.strip())
        assert started <= 10 + BWRAP_HELPER_PIDS
        assert group.limit_hit() == "pids"


def test_untouched_group_reports_no_hit(support: CgroupSupport) -> None:
    group = support.create(ResourceLimits(memory_bytes=256 << 20, pids=50))
    assert group is not None
    try:
        assert run_in(group.join_fn(), "print('ok')").stdout == "ok\n"
        assert group.limit_hit() is None
    finally:
        group.remove()


def test_cpu_quota_covers_children(support: CgroupSupport) -> None:
    """Two busy children in a group of 0.1 CPU get a tenth of the wall time between them (one-sided: without the
    quota each gets up to a core's share)."""
    with limited(support, "cpus", ResourceLimits(cpus=0.1)) as group:
        code = (
            "import os, time\n"
            "w = time.monotonic()\n"
            "for _ in range(2):\n"
            "    if os.fork() == 0:\n"
            "        while time.monotonic() - w < 1.5: pass\n"
            "        os._exit(0)\n"
            "os.wait(); os.wait()\n"
            "t = os.times()\n"
            "print(t.children_user + t.children_system, time.monotonic() - w)\n"
        )
        cpu, wall = map(float, run_in(group.join_fn(), code).stdout.split())
        assert cpu <= 0.1 * wall + 0.15, (cpu, wall)


# -- the freezer ------------------------------------------------------------------------------------------------

#: Four children that wake their whole process group (SIGCONT) and fork, over and over, for at most a minute; each
#: counts its rounds in CPU time only (no file: the group is watched from its processes' CPU times).
_FIGHTER = (
    "import os, signal, time\n"
    "end = time.monotonic() + 60\n"
    "for _ in range(4):\n"
    "    if os.fork() == 0:\n"
    "        while time.monotonic() < end:\n"
    "            os.killpg(0, signal.SIGCONT)\n"
    "            if os.fork() == 0: os._exit(0)\n"
    "            os.wait()\n"
    "        os._exit(0)\n"
    "print('up', flush=True)\n"
    "while True:\n"
    "    try: os.wait()\n"
    "    except ChildProcessError: break\n"
)
_V2 = Path("/sys/fs/cgroup/unified")


def _freezers() -> list[str]:
    return ["v1", "v2"]


@pytest.fixture(params=_freezers())
def freezer_support(request: pytest.FixtureRequest, support: CgroupSupport) -> Iterator[CgroupSupport]:
    """Groups with the freezer of one cgroup version: v1's controller (found by detect), or v2's ``cgroup.freeze`` in
    a group of the v2 hierarchy (here mounted beside v1's, without controllers)."""
    if request.param == "v1":
        if not support.freezes or "v1" not in support.describe()["freezer"]:
            pytest.skip("no cgroup v1 freezer here")
        yield support
        return
    if not (_V2 / "cgroup.procs").exists() or os.geteuid() != 0:
        pytest.skip("no cgroup v2 hierarchy we may make groups in")
    base = _V2 / f"execspace-test-{os.getpid()}"
    base.mkdir()
    try:
        yield CgroupSupport({"freezer": _Base("freezer", 2, base)})
    finally:
        base.rmdir()


@contextlib.contextmanager
def _fighting(group: RunCgroup) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _FIGHTER], preexec_fn=group.join_fn(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        yield proc
    finally:
        for pid in _members(group):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        _until("the group emptied", lambda: not _members(group))


def _members(group: RunCgroup) -> list[int]:
    """Every process of the run's freezer group and the groups below it."""
    return _everyone_in(group.paths["freezer"])


def _everyone_in(path: Path) -> list[int]:
    return [int(p) for f in path.rglob("cgroup.procs") for p in f.read_text().split()]


def _cpu(pids: list[int]) -> dict[int, int]:
    found = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            found[pid] = int(fields[11]) + int(fields[12])
    return found


def _until(what: str, check: Callable[[], object], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {within} s"
        time.sleep(0.01)


def _nothing_runs(pids: list[int], window: float = 1.0) -> None:
    before = _cpu(pids)
    deadline = time.monotonic() + window
    while time.monotonic() < deadline:
        time.sleep(0.1)
        assert _cpu(pids) == before, "a process of the frozen group ran"


async def test_the_freezer_holds_a_group_that_wakes_and_forks(freezer_support: CgroupSupport) -> None:
    group = freezer_support.create(ResourceLimits())
    assert group is not None
    try:
        with _fighting(group) as proc:
            async with held([group.freezer([proc.pid], ())]):
                pids = _members(group)
                assert len(pids) >= 5
                _nothing_runs(pids)
                for pid in pids:  # signals from outside do not thaw it
                    os.kill(pid, signal.SIGCONT)
                _nothing_runs(pids)
            # let go: every child runs again where it was held, its group thawed; the next hold takes them in from
            # there, and its group is the only one left after it
            _until("the children ran again", lambda: _moved(pids))
            async with held([group.freezer([proc.pid], ())]):
                _nothing_runs(_members(group), window=0.3)
            _until("the children ran again", lambda: _moved(_members(group)))
            assert len([p for p in group.paths["freezer"].iterdir() if p.is_dir()]) == 1
    finally:
        group.remove()
    assert not group.paths["freezer"].exists()


def _moved(pids: list[int]) -> bool:
    first = _cpu(pids)
    time.sleep(0.1)
    return _cpu(pids) != first


async def test_holds_nest_and_keep_spares_a_process_and_its_ancestors(freezer_support: CgroupSupport) -> None:
    """A session's supervisor keeps answering while its programs are held: ``keep`` (and what it descends from)
    runs on; a hold inside another one lets go only of what it held."""
    group = freezer_support.create(ResourceLimits())
    assert group is not None
    code = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nelse:\n    print('up', flush=True)\n    os.wait()"
    try:
        with _fighting(group) as fighter:
            kept = subprocess.Popen(
                [sys.executable, "-c", code], preexec_fn=group.join_fn(), stdout=subprocess.PIPE, text=True
            )
            try:
                assert kept.stdout is not None and kept.stdout.readline() == "up\n"
                (sleeper,) = (p for p in _members(group) if _parent(p) == kept.pid)
                async with held([group.freezer([fighter.pid], [kept.pid])]):
                    assert {kept.pid, sleeper} & set(_members_held(group)) == {sleeper}
                    async with held([group.freezer([fighter.pid], [kept.pid])]):
                        _nothing_runs(_members_held(group), window=0.3)
                    _nothing_runs(_members_held(group), window=0.3)  # the outer hold still holds
                    assert _state(kept.pid) != "D"
            finally:
                kept.kill()
                kept.wait()
                if kept.stdout is not None:
                    kept.stdout.close()
    finally:
        group.remove()


def _members_held(group: RunCgroup) -> list[int]:
    return [int(p) for f in group.paths["freezer"].glob("held-*/cgroup.procs") for p in f.read_text().split()]


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None  # a short-lived child of the fighter, gone


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


async def test_a_group_that_cannot_be_frozen_fails_the_hold_and_runs_on(freezer_support: CgroupSupport) -> None:
    """v2: a run group that may have no group below it (``cgroup.max.descendants`` 0) has no frozen group for a
    hold: the hold fails with FreezeFailed at once, and the group runs on."""
    if "v2" not in freezer_support.describe()["freezer"]:
        pytest.skip("a limit on groups below a group is cgroup v2's")
    group = freezer_support.create(ResourceLimits())
    assert group is not None
    try:
        (group.paths["freezer"] / "cgroup.max.descendants").write_text("0")
        with _fighting(group) as proc:
            started = time.monotonic()
            with pytest.raises(FreezeFailed, match="could not all be stopped"):
                async with held([group.freezer([proc.pid], ())]):
                    pytest.fail("held without a frozen group")
            assert time.monotonic() - started < 2  # an error is not waited out
            assert _moved(_members(group))
    finally:
        group.remove()


#: A holder: puts a sleeper in a fresh group of the given freezer (v1 by detect, v2 below BASE), holds it, says
#: ``held <pid>``, and waits to be killed.
_HOLDER = """
import asyncio, subprocess, sys
from pathlib import Path
from execspace import ResourceLimits
from execspace.backends.sandbox.cgroups import CgroupSupport, _Base
from execspace.process.freezing import held
from tests.support import held_still

version, base = sys.argv[1], sys.argv[2]
support = CgroupSupport.detect() if version == "v1" else CgroupSupport({"freezer": _Base("freezer", 2, Path(base))})
group = support.create(ResourceLimits())
sleeper = subprocess.Popen(["sleep", "60"], preexec_fn=group.join_fn())

async def main():
    async with held([group.freezer([sleeper.pid], ())]):
        print("held", sleeper.pid, group.paths["freezer"], flush=True)
        await asyncio.sleep(60)

asyncio.run(main())
"""


def test_a_hold_never_outlives_the_process_that_holds(freezer_support: CgroupSupport) -> None:
    """Killed while it holds a group (SIGKILL: nothing of it runs after), the holder leaves nothing frozen: its
    thawer lets the group go, so a sandbox whose bwrap dies with it (``--die-with-parent``) can die too."""
    version = "v1" if "v1" in freezer_support.describe()["freezer"] else "v2"
    base = str(freezer_support._bases["freezer"].path)  # type: ignore[attr-defined]
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, version, base], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    sleeper = 0
    group: Path | None = None
    try:
        assert holder.stdout is not None
        _, pid, path = holder.stdout.readline().split()
        sleeper, group = int(pid), Path(path)
        assert held_still(sleeper)
        holder.kill()
        holder.wait()
        _until("the sleeper thawed", lambda: not held_still(sleeper))
        os.kill(sleeper, signal.SIGKILL)  # as bwrap's death would: it dies at once
        _until("the sleeper died", lambda: not Path(f"/proc/{sleeper}").exists() or _state(sleeper) == "Z")
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
        if group is not None:  # a failed test leaves nothing frozen either
            for leftover in group.glob("held-*"):
                thaw = ("freezer.state", "THAWED") if version == "v1" else ("cgroup.freeze", "0")
                (leftover / thaw[0]).write_text(thaw[1])
        if sleeper:
            with contextlib.suppress(OSError):
                os.kill(sleeper, signal.SIGKILL)
        if group is not None:
            _until("the group emptied", lambda: not _everyone_in(group))
            for leftover in group.glob("held-*"):
                leftover.rmdir()
            group.rmdir()
