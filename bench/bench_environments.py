"""Many sandboxes on one runtime environment: what each adds on disk and in memory (issue 13's acceptance).

N sandboxes (default 200), each in its own workspace, run the environment's python importing numpy and then wait.
The baseline is the same program in ONE sandbox, measured first in the same run. For every sandbox the script reads
``/proc/<pid>/smaps`` of its python and adds up the mappings of files inside the environment's tree (the copied
interpreter, numpy's and OpenBLAS's shared objects): RSS counts them whole in each process, PSS splits each shared
page between the processes that map it, so one copy in the page cache shows as PSS ≈ RSS / N. On disk, a sandbox
adds its workspace (the layout, no copy of the tree): the script reports the workspaces' blocks divided by N against
the tree's size.

    .venv/bin/python bench/bench_environments.py [--n 200] [--environment code-interpreter]

Needs the environment built (``execspace env build code-interpreter``) and a working sandbox. Not part of
``./run bench`` (200 sandboxes with numpy take ~5 GB of memory and about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import execspace
from bench_core import machine_info, scratch_dir
from execspace import RunProgramSpec
from execspace.environments import EnvironmentStore

PROGRAM = "import numpy, sys, time; print('ready', flush=True); time.sleep(3600)"
BATCH = 20  # sandboxes started at once: 2 cores, 200 pythons importing numpy


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in os.listdir(f"/proc/{p}/task"):
            try:
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids = [int(c) for c in f.read().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def _python_of(bwrap_pid: int, tree: str) -> int:
    for pid in _descendants(bwrap_pid):
        try:
            if os.path.realpath(f"/proc/{pid}/exe").startswith(tree):
                return pid
        except OSError:
            continue
    raise RuntimeError(f"no python of the environment under bwrap {bwrap_pid}")


def _tree_memory(pid: int, tree: str) -> tuple[int, int, int, int]:
    """RSS, PSS and private dirty bytes (relocated data pages, copied on write) of the mappings of files in
    ``tree``, and the process's total PSS."""
    rss = pss = dirty = 0
    inside = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if not head:
                continue
            if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                inside = len(head) >= 6 and head[5].startswith(tree)
            elif inside and head[0] == "Rss:":
                rss += int(head[1]) * 1024
            elif inside and head[0] == "Pss:":
                pss += int(head[1]) * 1024
            elif inside and head[0] == "Private_Dirty:":
                dirty += int(head[1]) * 1024
    with open(f"/proc/{pid}/smaps_rollup") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
    return rss, pss, dirty, total


def _blocks(top: Path) -> int:
    total = 0
    for root, dirs, files in os.walk(top):
        total += sum(os.lstat(os.path.join(root, e)).st_blocks * 512 for e in (*dirs, *files))
    return total


async def _start(engine: Any, i: int) -> Any:
    ws = await engine.manager.create_workspace(f"bench-env/{i}")
    handle = await engine.runner.start_program(ws, RunProgramSpec("python", ["-c", PROGRAM], timeout=None))
    async for chunk in handle.attach():
        if b"ready" in chunk.data:
            return handle
    raise RuntimeError(f"sandbox {i} ended before it was ready: {await handle.wait()}")


def _measure(handles: list[Any], tree: str) -> list[float]:
    """Median per sandbox, in MiB, of each :func:`_tree_memory` figure."""
    rows = [_tree_memory(_python_of(h.pid, tree), tree) for h in handles]
    return [statistics.median(r[k] for r in rows) / 2**20 for k in range(4)]


async def run(n: int, name: str) -> None:
    env = EnvironmentStore().get(name)
    tree = str(env.path)
    print(f"machine: {machine_info()}")
    print(f"environment {env.name} at {tree}: {env.size_bytes / 2**20:.0f} MiB on disk\n")
    with scratch_dir("execspace-bench-env-") as scratch:
        root = scratch / "ws"
        async with execspace.open_engine("sandbox", workspace_root=root, environment=name) as engine:
            started = time.monotonic()
            first = await _start(engine, 0)
            baseline = _measure([first], tree)
            handles = [first]
            for at in range(1, n, BATCH):
                handles += await asyncio.gather(*(_start(engine, i) for i in range(at, min(n, at + BATCH))))
            took = time.monotonic() - started
            many = _measure(handles, tree)
            per_ws = _blocks(root) / n
            for h in handles:
                await h.kill()
    print(f"{n} sandboxes started (and numpy imported in each) in {took:.1f} s\n")
    print(f"{'per sandbox (median)':<44} {'1 sandbox':>12} {f'{n} sandboxes':>14} {'ratio':>8}")
    labels = (
        "RSS of the environment's files (MiB)",
        "PSS of the environment's files (MiB)",
        "  of which private (relocations, COW) (MiB)",
        "PSS of the whole python process (MiB)",
    )
    for label, one, at_n in zip(labels, baseline, many, strict=True):
        print(f"{label:<44} {one:>12.2f} {at_n:>14.2f} {at_n / one:>8.3f}")
    print(
        f"\ndisk per sandbox: {per_ws / 1024:.0f} KiB of workspace (the tree: {env.size_bytes / 2**20:.0f} MiB, "
        f"ratio {per_ws / env.size_bytes:.5f}); a copy per sandbox would be {n * env.size_bytes / 2**30:.1f} GiB"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=200, help="sandboxes to open (default 200)")
    p.add_argument("--environment", default="code-interpreter", help="a built environment with numpy")
    args = p.parse_args(argv)
    asyncio.run(run(args.n, args.environment))
    return 0


if __name__ == "__main__":
    sys.exit(main())
