"""A sandbox session's own limits (``SessionConfig.memory_bytes``/``pids``/``cpus``): every program of the session
counts together where a cgroup holds them (as root), a program past them is stopped (or throttled) by the kernel, and
the session goes on. Attacks are bounded (a few hundred MiB, 60 processes, two busy loops of 1.5 s)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import execspace
from execspace import CapabilityError, PutFile, RunProgramSpec
from execspace.backends.sandbox import SandboxBackend, SandboxOptions, SessionConfig
from execspace.registry import probe_backend
from execspace.workspace.diskimages import image_of, make_disk
from execspace.workspace.layout import sanitize_id
from tests.support import FORKS, make_traversable, mount_points_under

pytestmark = pytest.mark.timeout(120)
MIB = 1 << 20


async def _open(tmp_path: Path, config: SessionConfig) -> execspace.BaseEngine:
    probe = await probe_backend("sandbox", mode="session")
    if not probe.ok:
        pytest.skip(f"sandbox session mode unavailable: {probe.reason}")
    make_traversable(tmp_path)
    return await SandboxBackend.open(SandboxOptions(workspace_root=tmp_path / "ws", mode="session", session=config))


@pytest.fixture
async def limited(tmp_path: Path) -> AsyncIterator[execspace.BaseEngine]:
    if os.geteuid() != 0:
        pytest.skip("a session's processes are limited as a whole by a cgroup, made as root")
    engine = await _open(tmp_path, SessionConfig(pool_size=0, memory_bytes=128 * MIB, pids=40))
    caps = engine.describe()
    if not {"memory_bytes", "pids"} <= caps.enforced_limits:
        await engine.aclose()
        pytest.skip("no cgroup memory and pids controllers here")
    limits = caps.details["session_limits"]  # what holds each session, and how, is declared
    assert f"memory_bytes={128 * MIB}: cgroup" in limits and "pids=40: cgroup pids.max" in limits, limits
    try:
        yield engine
    finally:
        await engine.aclose()


def _allocate(mib: int, then: str = "") -> RunProgramSpec:
    code = f"b = bytearray({mib} * 2**20); b[::4096] = b'x' * len(b[::4096]); print('allocated', flush=True); {then}"
    return RunProgramSpec("python3", ["-c", code], timeout=60)


async def test_a_program_past_the_sessions_memory_is_killed_and_the_session_goes_on(
    limited: execspace.BaseEngine,
) -> None:
    ws = await limited.manager.create_workspace("limits/memory")
    r = await limited.runner.run_program(ws, _allocate(300))
    assert r.exit_code in (-9, 137) and "allocated" not in r.stdout, (r.exit_code, r.stdout, r.stderr)
    after = await limited.runner.run_program(ws, RunProgramSpec("echo", ["alive"]))
    assert (after.exit_code, after.stdout) == (0, "alive\n")


async def test_the_sessions_programs_share_its_memory(limited: execspace.BaseEngine) -> None:
    """Two programs of 80 MiB each fit a per-program limit of 128 MiB, not a session's: one of them is killed."""
    ws = await limited.manager.create_workspace("limits/shared")
    async with await limited.runner.start_program(ws, _allocate(80, "import time; time.sleep(30)")) as first:
        stream = first.stream()
        assert (await anext(stream)).data == b"allocated\n"
        second = await limited.runner.run_program(ws, _allocate(80))
        if second.exit_code == 0:  # the kernel chose the first one
            result = await first.wait()
            assert result.exit_code in (-9, 137), result
        else:
            assert second.exit_code in (-9, 137) and "allocated" not in second.stdout, second
            await first.kill()


async def test_the_sessions_processes_are_bounded_together(limited: execspace.BaseEngine) -> None:
    ws = await limited.manager.create_workspace("limits/pids")
    r = await limited.runner.run_program(ws, RunProgramSpec("python3", ["-c", FORKS], timeout=60))
    assert r.exit_code == 0, r.stderr
    assert 0 < int(r.stdout) < 40  # the supervisor and this program count too
    after = await limited.runner.run_program(ws, RunProgramSpec("echo", ["alive"]))
    assert (after.exit_code, after.stdout) == (0, "alive\n")


async def test_the_sessions_programs_share_its_cpu_quota(tmp_path: Path) -> None:
    """``SessionConfig.cpus``: two busy programs of one session get its quota between them (one-sided: without it
    each gets up to a core's share), and ``describe()`` says what holds it."""
    if os.geteuid() != 0:
        pytest.skip("a session's CPU quota is a cgroup, made as root")
    engine = await _open(tmp_path, SessionConfig(pool_size=0, cpus=0.1))
    try:
        if "cpus" not in engine.describe().enforced_limits:
            pytest.skip("no cgroup cpu controller here")
        assert "cpus=0.1: cgroup CPU quota" in engine.describe().details["session_limits"]
        ws = await engine.manager.create_workspace("limits/cpu")
        busy = "import time; w, c = time.monotonic(), time.process_time()\nwhile time.monotonic() - w < 1.5: pass\n"
        busy += "print(time.process_time() - c, time.monotonic() - w)"
        spec = RunProgramSpec("python3", ["-c", busy], timeout=60)
        runs = await asyncio.gather(*(engine.runner.run_program(ws, spec) for _ in range(2)))
        cpu = sum(float(r.stdout.split()[0]) for r in runs)
        wall = max(float(r.stdout.split()[1]) for r in runs)
        assert cpu <= 0.1 * wall + 0.15, (cpu, wall)
    finally:
        await engine.aclose()


async def test_a_limit_that_cannot_hold_is_refused_and_bad_values_too(tmp_path: Path) -> None:
    with pytest.raises(execspace.InvalidSpec):
        SessionConfig(memory_bytes=0)
    with pytest.raises(execspace.InvalidSpec):
        SessionConfig(cpus=0)
    if os.geteuid() == 0:
        pytest.skip("as root the session's pids are limited (a cgroup or its uid's RLIMIT_NPROC), its CPU too")
    with pytest.raises(CapabilityError, match=r"SessionConfig\.pids"):
        await _open(tmp_path, SessionConfig(pool_size=0, pids=40))
    with pytest.raises(CapabilityError, match=r"SessionConfig\.cpus"):
        await _open(tmp_path, SessionConfig(pool_size=0, cpus=0.5))


def _mounts() -> str:
    with open("/proc/self/mountinfo") as f:
        return f.read()


@pytest.fixture
def unmounted_after(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path``, with whatever a failed test left mounted under it detached afterwards (so that pytest's removal
    of old temporary directories never meets a mount)."""
    yield tmp_path
    for point in mount_points_under(tmp_path):
        subprocess.run(["umount", "-l", point], check=False)


def _fill(mib: int, where: str = "big") -> RunProgramSpec:
    return RunProgramSpec("sh", ["-c", f"dd if=/dev/zero of={where} bs=1M count={mib} 2>&1; echo rc=$?"], timeout=60)


async def test_a_sessions_disk_is_bounded_and_removal_leaves_no_mount_or_image(unmounted_after: Path) -> None:
    """``SessionConfig.disk_bytes``: a write past it fails with ENOSPC in the program, the workspace goes on (a file
    that fits is written once the big one is removed), ``/tmp`` is bounded too, another workspace is unaffected; its
    cleanup leaves no mount, no image and no loop device on it."""
    if os.geteuid() != 0:
        pytest.skip("a workspace's disk bound is a filesystem the host mounts, as root")
    engine = await _open(unmounted_after, SessionConfig(disk_bytes=20 * MIB))
    disks = unmounted_after / "ws" / ".disks"
    try:
        caps = engine.describe()
        assert "disk_bytes=20971520: each workspace is a filesystem" in caps.details["session_limits"]
        assert caps.fork is None  # it has no forks or snapshots, and says so
        ws = await engine.manager.create_workspace("limits/disk")
        other = await engine.manager.create_workspace("limits/other")
        assert ws.host_path is not None and f" {ws.host_path} " in _mounts()
        full = await engine.runner.run_program(ws, _fill(30))
        assert "No space left on device" in full.stdout and "rc=1" in full.stdout, full.stdout
        refill = "rm big && dd if=/dev/zero of=f bs=1M count=5 2>/dev/null && wc -c < f"
        fits = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", refill]))
        assert (fits.exit_code, fits.stdout) == (0, "5242880\n"), fits
        tmp = await engine.runner.run_program(ws, _fill(30, "/tmp/big"))
        assert "No space left on device" in tmp.stdout, tmp.stdout
        elsewhere = await engine.runner.run_program(other, _fill(15))
        assert "rc=0" in elsewhere.stdout, elsewhere.stdout  # a disk of its own: the first one's files are not on it
        assert len(list(disks.iterdir())) == 2
        with pytest.raises(CapabilityError, match="disk-bounded"):
            await engine.manager.fork(ws)
        for each in (ws, other):
            await engine.manager.cleanup(each)
            assert f" {each.host_path} " not in _mounts() and not Path(str(each.host_path)).exists()
        assert list(disks.iterdir()) == []
    finally:
        await engine.aclose()
    await _no_loop_device_on(disks)


async def test_a_bounded_workspace_whose_mount_is_gone_is_mounted_again_when_opened(unmounted_after: Path) -> None:
    """After a reboot the image is kept and the mount gone (made here with a lazy unmount): the next engine's
    ``get_workspace`` mounts it again, the files and the bound with it; its cleanup then removes the image."""
    if os.geteuid() != 0:
        pytest.skip("a workspace's disk bound is a filesystem the host mounts, as root")
    config = SessionConfig(disk_bytes=20 * MIB)
    engine = await _open(unmounted_after, config)
    try:
        ws = await engine.manager.create_workspace("limits/reboot")
        await engine.fs.put_files(ws, [PutFile("work/kept.txt", b"on its own disk")])
    finally:
        await engine.aclose()
    umount = await asyncio.create_subprocess_exec("umount", "-l", str(ws.host_path))
    assert await umount.wait() == 0 and f" {ws.host_path} " not in _mounts()
    engine = await _open(unmounted_after, config)
    try:
        again = await engine.manager.get_workspace("limits/reboot")
        assert f" {again.host_path} " in _mounts()
        assert (await engine.fs.read_file(again, "work/kept.txt")).content == b"on its own disk"
        full = await engine.runner.run_program(again, _fill(30))
        assert "No space left on device" in full.stdout, full.stdout
        await engine.manager.cleanup(again)
    finally:
        await engine.aclose()
    assert list((unmounted_after / "ws" / ".disks").iterdir()) == [] and f" {ws.host_path} " not in _mounts()
    await _no_loop_device_on(unmounted_after / "ws" / ".disks")


async def test_a_disk_made_but_never_laid_out_is_removed_when_opened(unmounted_after: Path) -> None:
    """A maker killed between a workspace's disk and its record (a server's pool, SIGKILLed) leaves a mounted image
    that never was a workspace: opening it answers WorkspaceNotFound and removes it, mount and image."""
    if os.geteuid() != 0:
        pytest.skip("a workspace's disk bound is a filesystem the host mounts, as root")
    engine = await _open(unmounted_after, SessionConfig(disk_bytes=20 * MIB))
    try:
        half = engine.manager.root / sanitize_id("limits/half")
        half.mkdir(parents=True)
        make_disk(half, 20 * MIB)  # what the killed maker got done
        assert f" {half} " in _mounts()
        with pytest.raises(execspace.WorkspaceNotFound):
            await engine.manager.get_workspace("limits/half")
        assert f" {half} " not in _mounts() and not half.exists() and not image_of(half).exists()
    finally:
        await engine.aclose()
    await _no_loop_device_on(unmounted_after / "ws" / ".disks")


async def _no_loop_device_on(disks: Path) -> None:
    """Poll until no loop device is backed by an image of ``disks`` (a detached one frees itself once unused)."""
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        loops = await asyncio.create_subprocess_exec("losetup", "-a", stdout=asyncio.subprocess.PIPE)
        listed = (await loops.communicate())[0].decode()
        if str(disks) not in listed:
            return
        assert asyncio.get_running_loop().time() < deadline, listed
        await asyncio.sleep(0.1)


async def test_a_disk_bound_is_refused_where_it_cannot_hold(tmp_path: Path) -> None:
    with pytest.raises(execspace.InvalidSpec, match="disk_bytes must be at least"):
        SessionConfig(disk_bytes=4096)
    if os.geteuid() == 0:
        pytest.skip("as root a session's disk can be bounded")
    with pytest.raises(CapabilityError, match=r"SessionConfig\.disk_bytes.*run as root"):
        await _open(tmp_path, SessionConfig(pool_size=0, disk_bytes=20 * MIB))
