"""Idle pausing benchmark (17): what resuming an idle-paused sandbox adds to its next command.

A server subprocess (``execspace serve --idle-pause 1``, the default ``sandbox`` backend) holds a few ``autoPause``
sandboxes whose only program sleeps and a running sandbox without ``autoPause``. Each round waits, untimed, until
the server has paused every idle one (``get_info`` says ``paused``), then times ``commands.run('true')`` on each of
them (the request resumes it: the cgroup thaw, or ``SIGCONT`` without root, and the lifetime clock) interleaved with
the same command on the running sandbox, the baseline. The issue's goal: ≤ 5 ms added.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Any

from bench_core import Plan, Report, Row, Stats, scratch_dir
from bench_serve import KEY, _listening
from execspace.testing.binding import make_traversable

SECTION = "17 idle"
#: Seconds of idleness after which the server pauses an autoPause sandbox (it looks once a second).
IDLE_PAUSE = 1
#: Idle sandboxes timed per round.
PER_ROUND = 4


async def run_idle(plan: Plan, report: Report, log: Any) -> None:
    try:
        from e2b import Sandbox, SandboxState
    except ImportError:
        report.notes.append("idle pausing skipped: the e2b SDK is not installed (pip install 'execspace[dev]')")
        return
    rounds = 5 if plan.true_iters < 500 else 15
    with scratch_dir("bench-idle-") as root:
        make_traversable(root)
        argv = [sys.executable, "-m", "execspace", "serve", "--port", "0", "--api-key", KEY]
        argv += ["--workspace-root", str(root), "--idle-pause", str(IDLE_PAUSE), "--pool-size", str(PER_ROUND + 1)]
        with _listening(argv, "execspace serve") as (url, _pid):
            api = {"api_key": KEY, "api_url": url, "sandbox_url": url}
            log(f"idle: {rounds} rounds of {PER_ROUND} idle-paused sandboxes against a running one")
            running = await asyncio.to_thread(Sandbox.create, timeout=600, **api)
            idle = [
                await asyncio.to_thread(Sandbox.create, timeout=600, lifecycle={"on_timeout": "pause"}, **api)
                for _ in range(PER_ROUND)
            ]
            for sandbox in idle:
                handle = await asyncio.to_thread(sandbox.commands.run, "sleep 3600", background=True)
                await asyncio.to_thread(handle.disconnect)
            await asyncio.to_thread(running.commands.run, "true")  # warm: its session started

            def paused(sandbox: Any) -> bool:
                return bool(Sandbox.get_info(sandbox.sandbox_id, **api).state is SandboxState.PAUSED)

            async def timed(sandbox: Any) -> float:
                t0 = time.perf_counter()
                done = await asyncio.to_thread(sandbox.commands.run, "true")
                elapsed = time.perf_counter() - t0
                if done.exit_code != 0:
                    raise RuntimeError(f"commands.run('true') exited with {done.exit_code}")
                return elapsed

            resumed: list[float] = []
            base: list[float] = []
            waits: list[float] = []
            try:
                for i in range(rounds):
                    waited = time.monotonic()
                    await _until(lambda: all(paused(s) for s in idle), within=60)
                    waits.append(time.monotonic() - waited)
                    for k, sandbox in enumerate(idle):
                        pair = [(resumed, sandbox), (base, running)]
                        for side, target in pair if (i + k) % 2 == 0 else pair[::-1]:
                            side.append(await timed(target))
                    if not all(not paused(s) for s in idle):
                        raise RuntimeError("a sandbox's command did not resume it")
            finally:
                for sandbox in (running, *idle):
                    await asyncio.to_thread(sandbox.kill)
    row = Row(
        SECTION,
        "commands.run('true') on an idle-paused sandbox (resumed by it)",
        "ms",
        Stats.of(resumed, 1e3),
        Stats.of(base, 1e3),
        "the same on a running sandbox",
        target="Δ ≤ 5 ms",
    )
    row.passed = row.lib.median - (row.base.median if row.base else 0) <= 5
    report.rows.append(row)
    report.notes.append(
        f"idle: with --idle-pause {IDLE_PAUSE}, {PER_ROUND} sleeping sandboxes were all paused again "
        f"{statistics.median(waits):.1f} s (median) after the last command of each (looks once a second)"
    )


async def _until(check: Any, within: float) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the idle sandboxes were not paused within {within:g} s")
        await asyncio.sleep(0.05)
