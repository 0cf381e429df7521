"""Machine mode's cost (``machine=True``): ``/bin/true`` per run and in a session, with and without it, measured in
the same run (interleaved rounds). As root (machine mode needs it).

    python bench/bench_machine.py [--runs 40]

A per-run machine sandbox pays for its namespace and overlays at every start (the helper: a user namespace, a
mount namespace, one overlay per system directory); in a session they are made once, so a run costs what any
session run costs plus the ``setpriv`` that makes it ``user``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import execspace
from execspace import RunProgramSpec
from execspace.backends.sandbox import SessionConfig


async def _timed(engine: execspace.BaseEngine, ws: execspace.Workspace, runs: int, out: list[float]) -> None:
    spec = RunProgramSpec("/bin/true", timeout=30)
    for _ in range(runs):
        start = time.perf_counter()
        r = await engine.runner.run_program(ws, spec)
        out.append(time.perf_counter() - start)
        assert r.exit_code == 0, r.stderr


async def _mode(root: Path, mode: str, runs: int) -> None:
    extra: dict[str, object] = {"mode": "session", "session": SessionConfig(pool_size=0)} if mode == "session" else {}
    times: dict[bool, list[float]] = {False: [], True: []}
    async with (
        execspace.open_engine("sandbox", workspace_root=root / f"{mode}-plain", **extra) as plain,  # type: ignore[call-overload]
        execspace.open_engine("sandbox", workspace_root=root / f"{mode}-machine", machine=True, **extra) as machine,  # type: ignore[call-overload]
    ):
        wss = {False: await plain.manager.create_workspace("b"), True: await machine.manager.create_workspace("b")}
        engines = {False: plain, True: machine}
        for on in (False, True):  # warm: the first session start, the layers made
            await _timed(engines[on], wss[on], 2, [])
        for _ in range(10):  # interleaved rounds
            for on in (False, True):
                await _timed(engines[on], wss[on], max(1, runs // 10), times[on])
    base, mach = (statistics.median(times[on]) * 1000 for on in (False, True))
    print(f"{mode:8} /bin/true median: without {base:6.2f} ms, machine {mach:6.2f} ms (+{mach - base:5.2f} ms)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("machine mode needs root")
    with tempfile.TemporaryDirectory(prefix="bench-machine-") as tmp:
        os.chmod(tmp, 0o711)  # the sandboxes' uids traverse it
        print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        await _mode(Path(tmp), "per-run", args.runs)
        await _mode(Path(tmp), "session", args.runs * 5)


if __name__ == "__main__":
    asyncio.run(main())
