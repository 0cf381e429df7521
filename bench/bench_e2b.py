"""e2b backend benchmarks (8): the e2b engine against ``execspace serve``, with the sandbox backend in session mode
(what serve runs each sandbox on) called directly in the same run as the baseline.

The ratio is the protocol's overhead: the SDK's HTTP and Connect round trips, serve's routing, and what the e2b
engine adds on top (a wrapper shell per run, the in-sandbox agent's path checks per file operation). The target is
the issue's: run_program at most 2× the direct call. A bare SDK ``commands.run`` on the same server shows how much
of it is the protocol and serve (the floor) and how much the engine. A put + read of a 1 MiB file shows the files
API's cost (one upload, one download, and one in-sandbox agent start per path check). A run on a pty (the SDK's
``sandbox.pty``: a login bash that execs the program from ``PROMPT_COMMAND``) is timed against the same run without
one, on the same engine and server.

    python bench/bench_e2b.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import execspace
from bench_core import MIB, Plan, Report, Row, Stats, Step, backend_ready, interleaved, ok, scratch_dir
from bench_serve import KEY, _server
from execspace import PutFile, RunProgramSpec

SECTION = "8 e2b"
_BASELINE = "sandbox backend, session mode, direct"


async def run_e2b(plan: Plan, report: Report, log: Any) -> None:
    if not await backend_ready("sandbox", "8 e2b benchmarks", report, log, mode="session"):
        return
    try:
        import e2b  # noqa: F401 - only whether it is there
    except ImportError:
        report.notes.append("e2b: the SDK is not installed (pip install 'execspace[e2b]'): skipped")
        return
    log("8 e2b")
    with scratch_dir("execspace-bench-e2b-") as root, _server(root / "serve", 10, 2) as (url, _pid):
        os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=KEY)  # for the SDK's own row
        remote = execspace.open_engine(
            "e2b", api_url=url, sandbox_url=url, api_key=KEY, template="base", persistence="turn"
        )
        direct = execspace.open_engine("sandbox", mode="session", workspace_root=root / "direct")
        async with remote as e2b_engine, direct as sandbox_engine:
            far = await e2b_engine.manager.create_workspace("bench-e2b")
            near = await sandbox_engine.manager.create_workspace("bench-e2b")
            await _run_true(e2b_engine, far, sandbox_engine, near, plan, report)
            await _pty_start(e2b_engine, far, plan, report)
            await _put_read(e2b_engine, far, sandbox_engine, near, plan, report)
            await _execute_code(e2b_engine, far, plan, report)


async def _run_true(
    remote: execspace.BaseEngine,
    far: execspace.Workspace,
    direct: execspace.BaseEngine,
    near: execspace.Workspace,
    plan: Plan,
    report: Report,
) -> None:
    spec = RunProgramSpec("/bin/true")

    async def e2b_run() -> None:
        ok((await remote.runner.run_program(far, spec)).exit_code, "e2b run_program('/bin/true')")

    async def sandbox_run() -> None:
        ok((await direct.runner.run_program(near, spec)).exit_code, "sandbox run_program('/bin/true')")

    from e2b import AsyncSandbox

    bare = await AsyncSandbox.create(template="base")  # the protocol's own floor: the SDK, no engine
    try:

        async def sdk_run() -> None:
            await bare.commands.run("/bin/true")

        steps = [e2b_run, sandbox_run, sdk_run]
        rpc_run = _process_rpc(bare)
        if rpc_run is not None:
            steps.append(rpc_run)
        lib, base, floor, *rpc = await interleaved(steps, plan.serve_iters, plan.warmup // 3)
    finally:
        await bare.kill()
    name = "run_program('/bin/true') via execspace serve"
    row = Row(SECTION, name, "ms", Stats.of(lib, 1000), Stats.of(base, 1000), _BASELINE)
    assert row.ratio is not None
    row.target, row.passed = "≤ 2× direct", row.ratio <= 2.0
    report.rows.append(row)
    name = "SDK commands.run('/bin/true') on execspace serve (no engine)"
    report.rows.append(Row(SECTION, name, "ms", Stats.of(floor, 1000), Stats.of(base, 1000), _BASELINE))
    name = "run_program('/bin/true') via execspace serve, against the SDK's own"
    label = "the SDK's commands.run('/bin/true') on the same server (no engine)"
    row = Row(SECTION, name, "ms", Stats.of(lib, 1000), Stats.of(floor, 1000), label)
    assert row.ratio is not None
    row.target, row.passed = "≤ 1.2× the SDK's", row.ratio <= 1.2
    report.rows.append(row)
    if rpc:
        name = "SDK process RPC: /bin/true itself, no shell (no engine)"
        report.rows.append(Row(SECTION, name, "ms", Stats.of(rpc[0], 1000), Stats.of(base, 1000), _BASELINE))
    else:
        report.notes.append("8 e2b: the SDK's process client has another shape in this version: no-shell row skipped")


def _process_rpc(sandbox: Any) -> Step | None:
    """The least any client of the official SDK can do per run: envd's process ``Start`` of ``/bin/true`` itself
    (no ``bash -l -c``, which ``commands.run`` always sends), read to its end. Through the SDK's private process
    client (the same call ``commands.run`` makes, with another ``cmd``), so only a floor, measured here and nowhere
    used; None where that client has another shape (the SDK changes it between versions)."""
    try:
        from e2b.envd.client_async import as_stream
        from e2b.envd.process import process_pb
        from e2b.envd.utils import authentication_header

        commands = sandbox.commands
        rpc, version, handle_of = commands._rpc, commands._envd_version, commands._create_handle
    except (ImportError, AttributeError):
        return None

    async def rpc_run() -> None:
        config = process_pb.ProcessConfig(cmd="/bin/true", args=[], envs={})
        events = as_stream(
            rpc.start(process_pb.StartRequest(process=config, stdin=False), headers=authentication_header(version))
        )
        handle = await handle_of(events, "start", None, None, None, False)
        ok((await handle.wait()).exit_code, "the SDK's process Start of /bin/true")

    return rpc_run


async def _pty_start(remote: execspace.BaseEngine, far: execspace.Workspace, plan: Plan, report: Report) -> None:
    plain, on_pty = RunProgramSpec("/bin/true"), RunProgramSpec("/bin/true", pty=execspace.PtySize())

    def step(spec: RunProgramSpec) -> Any:
        async def run() -> None:
            ok((await remote.runner.run_program(far, spec)).exit_code, f"e2b run_program({spec.cmd!r}, pty={spec.pty})")

        return run

    lib, base = await interleaved([step(on_pty), step(plain)], plan.serve_iters, plan.warmup // 3)
    name = "run_program('/bin/true') on a pty via execspace serve"
    baseline = "the same run without a pty (e2b engine, same server)"
    report.rows.append(Row(SECTION, name, "ms", Stats.of(lib, 1000), Stats.of(base, 1000), baseline))


async def _put_read(
    remote: execspace.BaseEngine,
    far: execspace.Workspace,
    direct: execspace.BaseEngine,
    near: execspace.Workspace,
    plan: Plan,
    report: Report,
) -> None:
    data = bytes(range(256)) * (MIB // 256)

    def step(engine: execspace.BaseEngine, ws: execspace.Workspace) -> Any:
        async def put_read() -> None:
            await engine.fs.put_files(ws, [PutFile("work/blob.bin", data)])
            if (await engine.fs.read_file(ws, "work/blob.bin")).content != data:
                raise RuntimeError(f"{engine.name}: the 1 MiB file came back changed")

        return put_read

    lib, base = await interleaved([step(remote, far), step(direct, near)], plan.serve_iters, plan.warmup // 3)
    report.rows.append(
        Row(SECTION, "put_files + read_file, 1 MiB", "ms", Stats.of(lib, 1000), Stats.of(base, 1000), _BASELINE)
    )


async def _execute_code(remote: execspace.BaseEngine, far: execspace.Workspace, plan: Plan, report: Report) -> None:
    """A warm cell through the e2b engine's code executor against the SDK's own ``run_code`` on the same server."""
    from e2b_code_interpreter import AsyncSandbox

    from execspace import CodeBlock, ResourceLimits

    assert isinstance(remote, execspace.SupportsKernels)
    kernels, limits = remote.kernels, ResourceLimits()

    async def engine_cell() -> None:
        result, _ = await kernels.run_block(far, CodeBlock("python", "1 + 1"), 0, timeout=60, limits=limits)
        ok(result.exit_code, "e2b execute_code('1 + 1')")

    bare = await AsyncSandbox.create(template="code-interpreter-v1")
    try:

        async def sdk_cell() -> None:
            if (await bare.run_code("1 + 1")).text != "2":
                raise RuntimeError("the SDK's run_code('1 + 1') did not give 2")

        # the first cell of each starts its kernel (about 0.6 s): warm-up, not timed
        lib, floor = await interleaved([engine_cell, sdk_cell], plan.serve_iters, max(plan.warmup // 3, 2))
    finally:
        await bare.kill()
    name = "execute_code('1 + 1') via execspace serve (warm kernel)"
    baseline = "the SDK's run_code('1 + 1') on the same server (no engine)"
    report.rows.append(Row(SECTION, name, "ms", Stats.of(lib, 1000), Stats.of(floor, 1000), baseline))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    from run_all import render_table

    report = Report()
    asyncio.run(run_e2b(Plan.quick() if args.quick else Plan(), report, lambda m: print(f"... {m}", file=sys.stderr)))
    print(render_table(report.rows))
    for note in report.notes + report.failed:
        print(f"  note: {note}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
