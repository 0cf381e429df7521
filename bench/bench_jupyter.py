"""Jupyter-backend benchmarks (5): cells through execspace against raw ``jupyter_client``.

Warm round trip: ``1+1`` through ``KernelSessions.execute`` against the same request sent on the
same kernel's own client by hand (execute, read iopub until the kernel is idle again), interleaved.
First result of a new session: a workspace's first ``1+1`` with a kernel from the warm pool
against the same with a cold kernel start (pool off), one of each per round, each after the pool
has refilled so that neither competes with a start-up the other caused (the pooled one does compete
with the refill its own new workspace starts, as a caller's would). On host kernels
(``mode=HostKernels()``) and on sandboxed kernels (the default where bubblewrap works), whose
pooled kernels start in workspace slots; the sandboxed warm round trip is also measured against raw
``jupyter_client`` on the same sandboxed kernel (over its IPC sockets).
"""

from __future__ import annotations

import contextlib
import queue
from typing import Any

import execspace
from bench_core import Plan, Report, Row, Stats, backend_ready, interleaved, scratch_dir, timed
from execspace import Workspace
from execspace.backends.jupyter import HostKernels, SandboxedKernels

SECTION = "5 jupyter"


async def _raw_cell(kc: Any, code: str) -> None:
    """The least a jupyter_client caller does for a result: send, read iopub to idle, drop the reply."""
    msg_id = kc.execute(code)
    while True:
        msg = await kc.get_iopub_msg(timeout=10)
        if (
            msg["parent_header"].get("msg_id") == msg_id
            and msg["header"]["msg_type"] == "status"
            and msg["content"]["execution_state"] == "idle"
        ):
            break
    with contextlib.suppress(queue.Empty):
        await kc.get_shell_msg(timeout=0)


def _client_of(kernels: Any, ws: Workspace) -> Any:
    # a benchmark may reach inside: the baseline must use the very kernel (and client) execspace uses
    return kernels._sessions[str(ws.host_path)].kernel.kc


async def _round_trip(plan: Plan, report: Report, engine: Any, what: str = "warm cell 1+1") -> None:
    kernels = engine.kernels
    ws = await engine.manager.create_workspace("bench/warm")
    assert (await kernels.execute(ws, "1+1")).text == "2\n"
    kc = _client_of(kernels, ws)

    async def lib() -> None:
        await kernels.execute(ws, "1+1")

    async def raw() -> None:
        await _raw_cell(kc, "1+1")

    lib_t, raw_t = await interleaved([lib, raw], plan.true_iters // 2, plan.warmup)
    row = Row(SECTION, what, "ms", Stats.of(lib_t, 1e3), Stats.of(raw_t, 1e3), "raw jupyter_client")
    row.target, row.passed = "≤ +2 ms", row.lib.median - row.base.median <= 2.0 if row.base else None
    report.rows.append(row)


async def _first_result(
    plan: Plan, report: Report, pooled: Any, cold: Any, what: str = "first 1+1 of a new session (pool)"
) -> None:
    rounds = max(5, plan.python_iters // 10)
    pool = pooled.kernels.pool
    warm_t: list[float] = []
    cold_t: list[float] = []
    for i in range(rounds):
        for engine, times in ((pooled, warm_t), (cold, cold_t)):
            if not await pool.wait_ready(60):
                raise RuntimeError(f"the warm pool did not fill: {pool.last_error}")
            kernels = engine.kernels
            ws = await engine.manager.create_workspace(f"bench/first-{i}")
            times.append(await timed(lambda k=kernels, w=ws: k.execute(w, "1+1")))
            await engine.manager.cleanup(ws)
    row = Row(SECTION, what, "ms", Stats.of(warm_t, 1e3), Stats.of(cold_t, 1e3), "cold kernel start")
    row.target, row.passed = "≤ 50 ms", row.lib.median <= 50.0
    report.rows.append(row)


async def _sandboxed(plan: Plan, report: Report, log: Any, tmp: Any) -> None:
    if not await backend_ready(
        "jupyter", "5 jupyter: sandboxed-kernel benchmarks", report, log, mode=SandboxedKernels()
    ):
        return
    tmp.chmod(0o711)  # the per-workspace sandbox uid must traverse to the workspaces
    async with (
        execspace.open_engine(
            "jupyter", workspace_root=tmp / "sb-pooled", mode=SandboxedKernels(pool_size=1)
        ) as pooled,
        execspace.open_engine("jupyter", workspace_root=tmp / "sb-cold", mode=SandboxedKernels(pool_size=0)) as cold,
    ):
        log("5 jupyter: warm cell round trip, sandboxed kernel")
        await _round_trip(plan, report, cold, "warm cell 1+1 (sandboxed kernel)")
        log("5 jupyter: first result of a new session, sandboxed kernel: pool vs cold start")
        await _first_result(plan, report, pooled, cold, "first 1+1 of a new session (sandboxed kernel, pool)")


async def run_jupyter(plan: Plan, report: Report, log: Any) -> None:
    if not await backend_ready("jupyter", "5 jupyter benchmarks", report, log):
        return
    with scratch_dir("execspace-bench-jupyter-") as tmp:
        async with (
            execspace.open_engine("jupyter", workspace_root=tmp / "pooled", mode=HostKernels(pool_size=1)) as pooled,
            execspace.open_engine("jupyter", workspace_root=tmp / "cold", mode=HostKernels(pool_size=0)) as cold,
        ):
            log("5 jupyter: warm cell round trip")
            await _round_trip(plan, report, cold)
            log("5 jupyter: first result of a new session, pool vs cold start")
            await _first_result(plan, report, pooled, cold)
            await _sandboxed(plan, report, log, tmp)
