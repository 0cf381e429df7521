"""What a rootfs environment costs (issue 13): its first build, its size, finding it built, and a sandbox run in it.

Builds a minimal Debian with jq (``base = "rootfs"``, ``apt = ["jq"]``) into a fresh store, from the host's apt
sources; the baseline is the built-in ``base`` environment (a venv of the host's Python), built into another fresh
store in the same run. Then the second (cached) build of each, and the median of ``true`` in a per-run sandbox on the
host's system directories vs in the rootfs.

    .venv/bin/python bench/bench_rootfs.py [--runs 30]

Needs root (mmdebstrap's root mode), mmdebstrap, a working sandbox and the network to the apt archive. Not part of
``./run bench`` (the first build downloads a minimal Debian).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

import execspace
from bench_core import machine_info, scratch_dir
from execspace import RunProgramSpec
from execspace.environments import EnvironmentSpec, EnvironmentStore, builtin_spec

SPEC = EnvironmentSpec(name="bench-rootfs", base="rootfs", apt=("jq",))


async def _timed_build(store: EnvironmentStore, spec: EnvironmentSpec) -> tuple[float, float, int]:
    started = time.perf_counter()
    env = await store.build(spec)
    first = time.perf_counter() - started
    started = time.perf_counter()
    await store.build(spec)
    return first, time.perf_counter() - started, env.size_bytes


async def _run_median(root: Path, environment: str | None, runs: int) -> float:
    async with execspace.open_engine("sandbox", workspace_root=root, environment=environment) as engine:
        ws = await engine.manager.create_workspace("bench")
        await engine.runner.run_program(ws, RunProgramSpec("true"))  # warm: the first run pays the caches
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            r = await engine.runner.run_program(ws, RunProgramSpec("true"))
            times.append(time.perf_counter() - started)
            assert r.exit_code == 0, r.stderr
        await engine.manager.cleanup(ws)
    return statistics.median(times)


async def main(runs: int) -> None:
    for key, value in machine_info().items():
        print(f"{key}: {value}")
    base = builtin_spec("base")
    assert base is not None
    with scratch_dir("bench-rootfs-") as scratch:
        os.chmod(scratch, 0o755)  # the sandbox's uid passes it to the store
        host_store, rootfs_store = EnvironmentStore(scratch / "host"), EnvironmentStore(scratch / "rootfs")
        for label, store, spec in (("base (venv, baseline)", host_store, base), ("rootfs + jq", rootfs_store, SPEC)):
            first, cached, size = await _timed_build(store, spec)
            print(f"{label}: first build {first:.1f} s, found built {cached * 1000:.1f} ms, {size / 2**20:.0f} MiB")
        os.environ["EXECSPACE_ENVIRONMENTS"] = str(rootfs_store.root)
        host = await _run_median(scratch / "ws-host", None, runs)
        rootfs = await _run_median(scratch / "ws-rootfs", SPEC.name, runs)
        print(f"sandbox `true`, median of {runs}: host system {host * 1000:.1f} ms, rootfs {rootfs * 1000:.1f} ms")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    asyncio.run(main(parser.parse_args().runs))
