"""Workspace snapshots and forks (issue 18), against a full copy of the same workspace measured in the same run.

    python bench/bench_fork.py [--files 10000] [--big-mib 1024] [--reps 20]

The workspace: ``--files`` small files (4 KiB each, in 100 directories) and four large files of real data (not
sparse: a copy must move every byte) making ``--big-mib`` in all. The sandbox backend (per-run mode) forks it:
copy-on-write where this process may mount overlays (root), plain copies elsewhere (the line says which).

Targets: fork p50 <= 10 ms (of a snapshot; of the live workspace, >= 50x faster than the copy too); snapshot of a
fork p50 <= 20 ms; 100 forks in one call <= 500 ms; a read-mostly program (``cat`` of every small file) in a fork
within 1.2x of the same program in the parent (interleaved); disk used by 100 idle forks ~ only their changes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import execspace
from execspace import RunProgramSpec, Workspace
from execspace.workspace.hostmanager import HostWorkspaceManager, remove_workspace_tree
from execspace.workspace.layers import LAYERS_DIR
from execspace.workspace.treecopy import tree_size

_MIB = 1024 * 1024


def _verdict(met: bool) -> str:
    return "PASS" if met else "MISS"


def _ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def _fill(work: Path, files: int, big_mib: int) -> None:
    block = os.urandom(4096)
    for i in range(files):
        d = work / "small" / f"d{i % 100:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}").write_bytes(block[i % 64 :] + block[: i % 64])
    chunk = os.urandom(_MIB)
    for i in range(4):
        with open(work / f"big{i}.bin", "wb") as f:
            for _ in range(big_mib // 4):
                f.write(chunk)


def _du(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return tree_size(fd)
    finally:
        os.close(fd)


async def _run(engine: execspace.BaseEngine, ws: Workspace) -> float:
    spec = RunProgramSpec("/bin/sh", ["-c", "find small -type f | xargs cat > /dev/null"], timeout=120)
    t = time.perf_counter()
    result = await engine.runner.run_program(ws, spec)
    elapsed = time.perf_counter() - t
    assert result.ok, result.stderr
    return elapsed


async def main(files: int, big_mib: int, reps: int) -> None:
    base = Path(tempfile.mkdtemp(prefix="bench-fork-", dir="/var/tmp"))
    os.chmod(base, 0o711)
    root = base / "ws"
    try:
        async with execspace.open_engine("sandbox", workspace_root=root) as engine:
            m = engine.manager
            assert isinstance(m, HostWorkspaceManager)
            ws = await m.create_workspace("bench/parent")
            assert ws.host_path is not None
            t = time.perf_counter()
            await asyncio.to_thread(_fill, ws.host_path / "work", files, big_mib)
            os.sync()
            size = _du(ws.host_path)
            print(
                f"workspace: {files} files + {big_mib} MiB of real data ({size / _MIB:.0f} MiB on disk), "
                f"written in {time.perf_counter() - t:.1f} s; fork mode: {m.fork_mode}"
            )

            # the baseline: a full copy of the same tree (cp -a), then the first snapshot (as root it moves the tree
            # into the store after a walk of it; a normal user's is a full copy)
            copies = []
            for i in range(3):
                t = time.perf_counter()
                subprocess.run(["cp", "-a", str(ws.host_path), str(base / f"copy{i}")], check=True)
                copies.append(time.perf_counter() - t)
                shutil.rmtree(base / f"copy{i}")
            t = time.perf_counter()
            snap = await m.snapshot(ws, name="base")
            first_snapshot = time.perf_counter() - t
            how = "a walk and a rename, once" if m.fork_mode == "cow" else "a full copy"
            print(
                f"full copy (cp -a) p50 {_ms(copies):8.1f} ms; first snapshot of the plain workspace "
                f"{first_snapshot * 1000:8.1f} ms ({how})"
            )

            live_t: list[float] = []
            for _ in range(reps):
                t = time.perf_counter()
                live = await m.fork(ws)
                live_t.append(time.perf_counter() - t)
                await m.cleanup(live[0])
            ratio = _ms(copies) / _ms(live_t)
            print(
                f"fork of the live workspace p50 {_ms(live_t):8.2f} ms ({ratio:,.0f}x faster than the copy)   "
                f"target <= 10 ms and >= 50x: {_verdict(_ms(live_t) <= 10 and ratio >= 50)}"
            )

            fork_t: list[float] = []
            forks: list[Workspace] = []
            for _ in range(reps):
                t = time.perf_counter()
                forks += await m.fork(snap)
                fork_t.append(time.perf_counter() - t)
            ratio = _ms(copies) / _ms(fork_t)
            print(
                f"fork of the snapshot p50 {_ms(fork_t):8.2f} ms ({ratio:,.0f}x faster than the copy)   "
                f"target <= 10 ms: {_verdict(_ms(fork_t) <= 10)}"
            )

            snap_t: list[float] = []
            for i, fork in enumerate(forks):
                await engine.fs.put_files(fork, [execspace.PutFile(f"work/change{i}.txt", b"x" * 1000)])
                t = time.perf_counter()
                await m.snapshot(fork)
                snap_t.append(time.perf_counter() - t)
            print(f"snapshot of a fork p50 {_ms(snap_t):8.2f} ms   target <= 20 ms: {_verdict(_ms(snap_t) <= 20)}")

            used_before = shutil.disk_usage(base).used
            t = time.perf_counter()
            hundred = await m.fork(snap, count=100)
            many = time.perf_counter() - t
            print(f"100 forks in one call {many * 1000:8.1f} ms   target <= 500 ms: {_verdict(many <= 0.5)}")
            own = sum(_du(root / LAYERS_DIR / f.host_path.name) for f in hundred if f.host_path is not None)
            if m.fork_mode == "copy":
                own = sum(_du(f.host_path) for f in hundred if f.host_path is not None)
            grown = shutil.disk_usage(base).used - used_before
            print(
                f"disk of 100 idle forks: {own / 1024:,.0f} KiB of their own (layers, records, layout), "
                f"filesystem grew {grown / _MIB:,.1f} MiB; the workspace is {size / _MIB:,.0f} MiB   "
                f"~ only their changes: {_verdict(own < size / 10)}"
            )

            fork = hundred[0]
            await _run(engine, ws)
            await _run(engine, fork)
            in_parent: list[float] = []
            in_fork: list[float] = []
            for _ in range(max(reps // 4, 5)):
                in_parent.append(await _run(engine, ws))
                in_fork.append(await _run(engine, fork))
            read_ratio = statistics.median(in_fork) / statistics.median(in_parent)
            print(
                f"read-mostly program (cat of {files} files): parent {_ms(in_parent):7.1f} ms, fork "
                f"{_ms(in_fork):7.1f} ms, {read_ratio:.2f}x   target <= 1.2x: {_verdict(read_ratio <= 1.2)}"
            )
    finally:
        if (root / LAYERS_DIR).is_dir():
            for name in os.listdir(root / LAYERS_DIR):
                remove_workspace_tree(root / name)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--big-mib", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.files, args.big_mib, args.reps))
