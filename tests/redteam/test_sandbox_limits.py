"""Every limit the sandbox declares in Capabilities, exceeded on purpose, observed from the host."""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import execspace
from execspace import ResourceLimits, RunProgramSpec, WorkspacePolicy
from execspace.registry import probe_backend
from tests.support import make_traversable

pytestmark = pytest.mark.timeout(90)

Box = tuple[execspace.BaseEngine, execspace.Workspace]


@pytest.fixture
async def box(tmp_path: Path, sandbox_mode: Mapping[str, Any]) -> AsyncIterator[Box]:
    probe = await probe_backend("sandbox", **sandbox_mode)
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", **sandbox_mode) as engine:
        yield engine, await engine.manager.create_workspace("limits/user/s")


async def sh(box: Box, script: str, limits: ResourceLimits, timeout: float = 60) -> execspace.RunResult:
    engine, ws = box
    return await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", script], limits=limits, timeout=timeout))


def require(box: Box, limit: str) -> str:
    caps = box[0].describe()
    if limit not in caps.enforced_limits:
        pytest.skip(f"the sandbox does not enforce {limit} here")
    return caps.details.get(limit, "")


async def test_memory_limit(box: Box) -> None:
    how = require(box, "memory_bytes")
    # three processes of 80 MiB each: under a whole-sandbox limit of 128 MiB this cannot all fit
    hog = "python3 -c \"import time; b = bytearray(80 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(1)\""
    r = await sh(box, f"{hog} & {hog} & {hog} & wait; echo done", ResourceLimits(memory_bytes=128 << 20))
    if "cgroup" in how:
        assert r.limit_hit == "memory_bytes", (r.exit_code, r.stderr[-500:])
    else:  # per-process RLIMIT_AS: each process alone must stay under the limit
        r = await sh(box, "python3 -c 'bytearray(512 << 20)'", ResourceLimits(memory_bytes=128 << 20))
        assert r.exit_code != 0 and "MemoryError" in r.stderr


async def test_pids_limit(box: Box) -> None:
    require(box, "pids")
    r = await sh(
        box,
        "n=0; i=0; while [ $i -lt 200 ]; do (sleep 2 &) 2>/dev/null && n=$((n+1)); i=$((i+1)); done; echo started=$n",
        ResourceLimits(pids=20),
    )
    assert r.exit_code != 0 or "fork" in r.stderr.lower() or r.limit_hit == "pids", r.stdout[-200:]
    if "cgroup" in box[0].describe().details.get("pids", ""):
        assert r.limit_hit == "pids"


async def test_cpu_seconds_limit(box: Box) -> None:
    require(box, "cpu_seconds")
    r = await sh(box, "exec python3 -c 'while True: pass'", ResourceLimits(cpu_seconds=1), timeout=30)
    assert not r.timed_out and r.exit_code != 0
    assert r.limit_hit == "cpu_seconds", r.exit_code


async def test_file_size_limit(box: Box) -> None:
    require(box, "file_size_bytes")
    engine, ws = box
    assert ws.host_path is not None
    r = await sh(box, 'head -c 5000000 /dev/zero > "$OUTPUT_DIR/big"', ResourceLimits(file_size_bytes=1 << 20))
    assert r.exit_code != 0
    assert (ws.host_path / "out" / "big").stat().st_size <= 1 << 20


_FALLOCATE = """
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long)
fd = os.open(os.environ["OUTPUT_DIR"] + "/f", os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"x" * 65536)
for name, mode in (("keep_size", 0x01), ("zero_keep", 0x11), ("plain", 0x00), ("punch", 0x03)):
    length = 4096 if name == "punch" else 200 << 20
    ok = libc.fallocate(fd, mode, 0, length) == 0
    print(name, "ok" if ok else errno.errorcode[ctypes.get_errno()])
os.close(fd)
"""


async def test_fallocate_cannot_reserve_past_the_file_size_limit(box: Box) -> None:
    """KEEP_SIZE reserves blocks without growing the file, so RLIMIT_FSIZE never sees them."""
    require(box, "file_size_bytes")
    engine, ws = box
    assert ws.host_path is not None
    r = await sh(box, f"python3 -c '{_FALLOCATE}'", ResourceLimits(file_size_bytes=20 << 20))
    assert r.exit_code == 0, r.stderr
    results = dict(line.split() for line in r.stdout.splitlines())
    # plain fallocate past the limit gets the kernel's EFBIG; punching a hole frees blocks and stays allowed
    unsupported = errno.errorcode[errno.EOPNOTSUPP]  # ENOTSUP on Linux: the same number
    assert results == {"keep_size": unsupported, "zero_keep": unsupported, "plain": "EFBIG", "punch": "ok"}
    assert (ws.host_path / "out" / "f").stat().st_blocks * 512 < 20 << 20


async def test_disk_limit_checked_after_run(tmp_path: Path) -> None:
    probe = await probe_backend("sandbox")
    if not probe.ok:
        pytest.skip(probe.reason)
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws") as engine:
        ws = await engine.manager.create_workspace("disk", WorkspacePolicy(max_disk_bytes=1 << 20))
        r = await engine.runner.run_program(
            ws, RunProgramSpec("sh", ["-c", 'head -c 3000000 /dev/zero > "$OUTPUT_DIR/fill"'])
        )
    assert r.exit_code == 0 and r.limit_hit == "disk_bytes"


async def test_run_dir_is_writable(box: Box) -> None:
    engine, ws = box
    assert ws.host_path is not None
    r = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", 'echo x > "$RUN_DIR/log" && echo ok']))
    assert r.stdout == "ok\n", r.stderr
    assert (ws.host_path / r.run_dir / "log").read_text() == "x\n"
