"""Per-run cgroups: limits hold for the whole process tree, and hits are reported."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

from execspace import ResourceLimits
from execspace.backends.sandbox.cgroups import BWRAP_HELPER_PIDS, CgroupSupport, RunCgroup

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


def test_nothing_requested_needs_no_group(support: CgroupSupport) -> None:
    assert support.create(ResourceLimits()) is None


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
