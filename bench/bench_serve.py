"""`execspace serve` benchmarks (7): the official E2B SDK against the server, with same-run baselines.

A server subprocess (``execspace serve --port 0``, the default ``sandbox`` backend) is started first. Creation is
compared with a **bare POST loop**: ``POST /v2/sandboxes`` by a plain httpx client on a kept-alive connection (the
shape of Cube Sandbox's ``benchmark.py``), so the row shows what the SDK adds; each created sandbox is killed
untimed. The targets are the issue's, from the figures self-hosted services publish (Cube: < 60 ms cold create,
67 ms average / 90 ms p95 at 50 concurrent, < 5 MB per sandbox). The command round trip is compared with a unary
envd call (``files.exists``) on the same sandbox: the protocol's floor, without a process.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

import execspace
from bench_core import Plan, Report, Row, Stats, backend_ready, interleaved, scratch_dir
from execspace import RunProgramSpec
from execspace.testing.binding import make_traversable
from execspace.testing.processes import read_until, terminate

SECTION = "7 serve"
CODE_TEMPLATE = "code-interpreter-v1"
#: Pooled code-interpreter sandboxes, each with its warm kernel (the PSS of one is their sum over this).
WARM_KERNELS = 2
KEY = "e2b_" + "0123456789abcdef" * 2


@contextlib.contextmanager
def _listening(argv: list[str], what: str) -> Iterator[tuple[str, int]]:
    env = {**os.environ, "EXECSPACE_DAEMON": "off", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        assert proc.stdout is not None
        found, _ = read_until(proc.stdout, rb"listening on (\S+)", 30)
        if found is None:
            raise RuntimeError(f"{what} did not start")
        yield found.group(1).decode(), proc.pid
    finally:
        terminate(proc)


def _server(root: Any, max_sandboxes: int, pool_size: int) -> contextlib.AbstractContextManager[tuple[str, int]]:
    argv = [sys.executable, "-m", "execspace", "serve", "--port", "0", "--api-key", KEY, "--workspace-root", str(root)]
    argv += ["--max-sandboxes", str(max_sandboxes), "--pool-size", str(pool_size)]
    argv += ["--pool-size", f"{CODE_TEMPLATE}={WARM_KERNELS}"]  # pooled code-interpreter sandboxes: warm kernels
    return _listening(argv, "execspace serve")


def _stub() -> contextlib.AbstractContextManager[tuple[str, int]]:
    """The bare HTTP loop (``stub_e2b_api.py``): uvicorn answering creates with a fixed 201, nothing else."""
    return _listening([sys.executable, str(Path(__file__).with_name("stub_e2b_api.py"))], "the stub server")


def _pool_counts(http: httpx.Client) -> str:
    base = http.get("/execspace/pool").json()["base"]
    return f"{base['taken']} creates took a ready sandbox, {base['missed']} found none (made cold)"


async def _pool_full(http: httpx.AsyncClient, within: float = 120.0) -> None:
    """Wait until the server's base pool holds what the room allows (``GET /execspace/pool``)."""
    deadline = time.monotonic() + within
    while True:
        base = (await http.get("/execspace/pool")).json()["base"]
        if base["ready"] >= base["target"]:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pool did not fill within {within:g} s: {base}")
        await asyncio.sleep(0.05)


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0)
    except OSError:  # gone meanwhile
        return 0


def _tree(root: int) -> list[int]:
    """``root`` and its descendants (a sandbox session's bwrap and supervisor are the server's children)."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{name}/stat") as f:
                parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
    tree, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        tree += frontier
    return tree


def _is_kernel(pid: int) -> bool:
    """Whether the process is a code-interpreter Python kernel (its launcher names IPKernelApp)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"IPKernelApp" in f.read()
    except OSError:
        return False


def _warm_kernels(http: httpx.Client, at_least: int, within: float = 120.0) -> None:
    """Wait until the code-interpreter pool holds ``at_least`` ready sandboxes with their warm kernels."""
    deadline = time.monotonic() + within
    while (pool := http.get("/execspace/pool").json()[CODE_TEMPLATE])["kernels"] < at_least:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the {CODE_TEMPLATE} pool did not get its warm kernels within {within:g} s: {pool}")
        time.sleep(0.05)


def _tree_pss_kib(root: int) -> int:
    return sum(_pss_kib(pid) for pid in _tree(root))


def _row(name: str, lib: list[float], base: list[float], base_label: str, target_ms: float, p90: bool = False) -> Row:
    row = Row(SECTION, name, "ms", Stats.of(lib, 1000), Stats.of(base, 1000), base_label)
    value = row.lib.p90 if p90 else row.lib.median
    row.target, row.passed = f"{'p90' if p90 else 'median'} ≤ {target_ms:g} ms", value <= target_ms
    return row


#: Whether serve runs its sandboxes in machine mode (its default as root): the engine it is compared with does too.
SERVE_MACHINE = os.geteuid() == 0
#: What serve may add to ``commands.run('true')`` over its floor: the SDK alone plus the engine alone (issue 30).
_OVER_FLOOR_MS = 1.0
#: What 50 concurrent SDK creates may cost over the same creates against a bare loop answering 201 (issue 30).
_CREATES_OVER_BARE = 1.3


def _over_floor(lib: list[float], client: list[float], engine: list[float]) -> Row:
    """``commands.run('true')`` against its floor: the medians of the SDK against a bare loop (the client's and the
    protocol's cost) and of ``bash -l -c true`` through the engine (the program's), added."""
    floor = statistics.median(client) + statistics.median(engine)
    row = Row(SECTION, "commands.run('true') over its floor", "ms", Stats.of(lib, 1000), Stats.of([floor], 1000),
              "the SDK against a bare loop + bash -l -c true through the engine (medians, added)")  # fmt: skip
    row.target = f"median ≤ floor + {_OVER_FLOOR_MS:g} ms"
    row.passed = row.lib.median <= row.base.median + _OVER_FLOOR_MS if row.base is not None else None
    return row


async def run_serve(plan: Plan, report: Report, log: Any) -> None:
    if not await backend_ready("sandbox", "7 serve benchmarks", report, log):
        return
    try:
        from e2b import AsyncSandbox, Sandbox
    except ImportError:
        report.notes.append("serve: e2b is not installed (pip install 'execspace[dev]'): skipped")
        return
    log("7 serve")
    pool = plan.serve_concurrency  # a burst of that many creates finds a ready sandbox each
    with scratch_dir("execspace-bench-serve-") as root, _server(root, 10 * pool, pool) as (url, pid):
        os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=KEY)
        http = httpx.Client(base_url=url, headers={"X-API-KEY": KEY})
        made: list[str] = []

        async def bare_create() -> None:
            answer = await asyncio.to_thread(http.post, "/v2/sandboxes", json={"templateID": "base"})
            if answer.status_code != 201:
                raise RuntimeError(f"bare create answered {answer.status_code}: {answer.text}")
            made.append(answer.json()["sandboxID"])

        async def sdk_create() -> None:
            made.append((await asyncio.to_thread(Sandbox.create)).sandbox_id)

        async def sdk_create_and_run() -> None:
            sbx = await asyncio.to_thread(Sandbox.create)
            made.append(sbx.sandbox_id)
            await asyncio.to_thread(sbx.commands.run, "true")

        async def kill_made() -> None:
            while made:
                http.delete(f"/sandboxes/{made.pop()}")

        try:
            async with httpx.AsyncClient(base_url=url, headers={"X-API-KEY": KEY}) as ahttp:
                await _pool_full(ahttp)
            iters, warmup = plan.serve_iters, plan.warmup // 3
            lib, cold, base = await interleaved([sdk_create, sdk_create_and_run, bare_create], iters, warmup)
            await kill_made()
            report.notes.append(f"serve: the pool after the one-by-one creates: {_pool_counts(http)}")
            report.rows.append(_row("create → 201 (SDK Sandbox.create)", lib, base, "bare POST loop", 10))
            report.rows.append(_row("create + first commands.run('true')", cold, base, "bare POST loop", 25))
            await _concurrent_creates(AsyncSandbox, url, pid, plan, report)
            report.notes.append(f"serve: the pool after the concurrent creates too: {_pool_counts(http)}")
            await _round_trip(Sandbox, plan, report)
            await _run_code_round_trip(plan, report, http, pid)
            await _commands_across_sandboxes(AsyncSandbox, plan, report)
            await _idle_memory(Sandbox, pid, plan, report)
        finally:
            await kill_made()
            http.close()


_CREATE_BODY = b'{"templateID":"base"}'
#: A create's seconds and its sandbox's id.
_Created = tuple[float, str]


async def _raw_creates(url: str, n: int) -> list[_Created]:
    """``n`` creates at once by a minimal HTTP/1.1 client (asyncio streams, one connection each, opened first as a
    kept-alive client's are): about 0.1 ms of client CPU per request, so what it times is the server's."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conns = [await asyncio.open_connection(host, int(port)) for _ in range(n)]
    head = (
        f"POST /v2/sandboxes HTTP/1.1\r\nHost: {host}\r\nX-API-KEY: {KEY}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(_CREATE_BODY)}\r\n\r\n"
    ).encode()

    async def create(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Created:
        t0 = time.perf_counter()
        writer.write(head + _CREATE_BODY)
        lines = (await reader.readuntil(b"\r\n\r\n")).decode().lower().split("\r\n")
        length = next(int(line.split(":", 1)[1]) for line in lines if line.startswith("content-length:"))
        body = json.loads(await reader.readexactly(length))
        return time.perf_counter() - t0, body["sandboxID"]

    try:
        return await asyncio.gather(*(create(r, w) for r, w in conns))
    finally:
        for _, writer in conns:
            writer.close()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (not its children: the sessions)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _concurrent_creates(sandbox_cls: Any, url: str, pid: int, plan: Plan, report: Report) -> None:
    """Per-create latency with ``serve_concurrency`` creates at once (each timed from its own start), the pool full
    before each round: the SDK's async client against ``execspace serve`` and, in the same run, against the bare
    HTTP loop (``stub_e2b_api.py``: the client's and HTTP stack's own cost), and the same for bare httpx POSTs.
    The client's CPU time per create (this process runs only the client) bounds what 50 at once can reach: one
    Python client serves them one after another; the server's CPU time per create during the burst is its own
    share (a refill may start within it, see server/pool.py)."""
    n = plan.serve_concurrency
    times: dict[str, list[float]] = {k: [] for k in ("sdk", "sdk_stub", "bare", "bare_stub", "raw", "raw_stub")}
    cpu: dict[str, list[float]] = {k: [] for k in times}
    server_cpu: dict[str, list[float]] = {"sdk": [], "raw": []}
    limits = httpx.Limits(max_connections=n)
    with _stub() as (stub_url, _):
        async with (
            httpx.AsyncClient(base_url=url, headers={"X-API-KEY": KEY}, limits=limits) as c,
            httpx.AsyncClient(base_url=stub_url, headers={"X-API-KEY": KEY}, limits=limits) as s,
        ):

            def bare(client: httpx.AsyncClient) -> Callable[[], Awaitable[tuple[float, str]]]:
                async def post() -> tuple[float, str]:
                    t0 = time.perf_counter()
                    answer = await client.post("/v2/sandboxes", json={"templateID": "base"})
                    return time.perf_counter() - t0, answer.json()["sandboxID"]

                return post

            def sdk(api_url: str) -> Callable[[], Awaitable[tuple[float, str]]]:
                async def create() -> tuple[float, str]:
                    t0 = time.perf_counter()
                    sbx = await sandbox_cls.create(api_url=api_url)
                    return time.perf_counter() - t0, sbx.sandbox_id

                return create

            def burst(one: Callable[[], Awaitable[_Created]]) -> Callable[[], Awaitable[list[_Created]]]:
                return lambda: asyncio.gather(*(one() for _ in range(n)))

            steps: dict[str, Callable[[], Awaitable[list[_Created]]]] = {
                "sdk": burst(sdk(url)),
                "sdk_stub": burst(sdk(stub_url)),
                "bare": burst(bare(c)),
                "bare_stub": burst(bare(s)),
                "raw": lambda: _raw_creates(url, n),
                "raw_stub": lambda: _raw_creates(stub_url, n),
            }
            order = list(steps.items())
            for i in range(plan.serve_rounds):
                for key, step in order if i % 2 == 0 else order[::-1]:
                    await _pool_full(c)
                    cpu0, server0 = time.process_time(), _cpu_seconds(pid)
                    done = await step()
                    cpu[key].append((time.process_time() - cpu0) / n)
                    if key in server_cpu:
                        server_cpu[key].append((_cpu_seconds(pid) - server0) / n)
                    times[key].extend(t for t, _ in done)
                    if not key.endswith("stub"):
                        await asyncio.gather(*(c.delete(f"/sandboxes/{sid}") for _, sid in done))
    label = "the same SDK creates against a bare HTTP loop (uvicorn, fixed 201)"
    report.rows.append(_row(f"create, {n} concurrent (per create)", times["sdk"], times["sdk_stub"], label, 10))
    rebased = Row(SECTION, f"create, {n} concurrent (per create) against the SDK's floor", "ms",
                  Stats.of(times["sdk"], 1000), Stats.of(times["sdk_stub"], 1000), label)  # fmt: skip
    rebased.target = f"median ≤ {_CREATES_OVER_BARE:g}× baseline"
    rebased.passed = rebased.ratio is not None and rebased.ratio <= _CREATES_OVER_BARE
    report.rows.append(rebased)
    report.rows.append(
        _row(f"create, {n} concurrent (per create, p90)", times["sdk"], times["sdk_stub"], label, 30, p90=True)
    )
    raw_label = "the same against the bare HTTP loop"
    name = f"create, {n} concurrent, minimal HTTP client (per create)"
    report.rows.append(_row(name, times["raw"], times["raw_stub"], raw_label, 10))
    report.rows.append(_row(f"{name[:-1]}, p90)", times["raw"], times["raw_stub"], raw_label, 30, p90=True))
    report.rows.append(
        Row(SECTION, f"server CPU per create, {n} concurrent (minimal client)", "ms", Stats.of(server_cpu["raw"], 1000),
            None, "")
    )  # fmt: skip
    bare_label = "as many bare httpx POSTs at once against the bare HTTP loop"
    report.rows.append(
        Row(SECTION, f"create, {n} concurrent bare httpx POSTs", "ms", Stats.of(times["bare"], 1000),
            Stats.of(times["bare_stub"], 1000), bare_label)
    )  # fmt: skip
    report.rows.append(
        Row(SECTION, f"client CPU per create, {n} concurrent (SDK)", "ms", Stats.of(cpu["sdk"], 1000),
            Stats.of(cpu["sdk_stub"], 1000), "the same against the bare HTTP loop")
    )  # fmt: skip
    report.rows.append(
        Row(SECTION, f"server CPU per create, {n} concurrent (SDK; the server process)", "ms",
            Stats.of(server_cpu["sdk"], 1000), Stats.of(cpu["sdk"], 1000), "client CPU per create (the SDK)")
    )  # fmt: skip
    report.rows.append(
        Row(SECTION, f"client CPU per create, {n} concurrent (bare httpx)", "ms", Stats.of(cpu["bare"], 1000),
            Stats.of(cpu["bare_stub"], 1000), "the same against the bare HTTP loop")
    )  # fmt: skip


@contextlib.contextmanager
def _bare_envd() -> Iterator[str]:
    """``bare_envd.py`` (canned answers, no process behind them) in a process of its own, as the server is."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bare_envd.py")
    proc = subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        found, _ = read_until(proc.stdout, rb"(\d+)\n", 30)
        if found is None:
            raise RuntimeError("bare_envd.py did not start")
        yield f"http://127.0.0.1:{found.group(1).decode()}"
    finally:
        terminate(proc)


async def _round_trip(sandbox_cls: Any, plan: Plan, report: Report) -> None:
    from execspace.server.serve import serve_sandbox_files

    sbx = await asyncio.to_thread(sandbox_cls.create)
    try:

        async def run_true() -> None:
            await asyncio.to_thread(sbx.commands.run, "true")

        async def stat() -> None:
            await asyncio.to_thread(sbx.files.exists, "nothing-here")

        with scratch_dir("execspace-bench-direct-") as root, _bare_envd() as bare_url:
            make_traversable(root)  # as root, the session's uid must reach its workspace
            bare = await asyncio.to_thread(sandbox_cls.create, api_key=KEY, api_url=bare_url, sandbox_url=bare_url)
            # what serve's sandboxes run for commands.run('true'), their own /etc/profile included, in machine mode
            # where serve has it (as root)
            template = {"program_binds": (("/home/user", "work"),), "system_files": serve_sandbox_files()}
            if SERVE_MACHINE:
                template["machine"] = True
            async with execspace.open_engine("sandbox", mode="session", workspace_root=root, **template) as engine:
                ws = await engine.manager.create_workspace("bench/direct")
                login_true = RunProgramSpec("/bin/bash", ["-l", "-c", "true"], cwd="/home/user")

                async def direct() -> None:  # what serve does for commands.run('true'), without the protocol
                    await engine.runner.run_program(ws, login_true)

                async def sdk_alone() -> None:
                    await asyncio.to_thread(bare.commands.run, "true")

                steps = [run_true, stat, direct, sdk_alone]
                lib, base, floor, client = await interleaved(steps, plan.serve_iters, plan.warmup // 3)
        report.rows.append(_row("commands.run('true') in a live sandbox", lib, base, "files.exists (unary envd)", 3))
        direct_label = "bash -l -c true through the sandbox engine (session mode, machine mode as root) directly"
        report.rows.append(
            Row(SECTION, "commands.run('true') vs the engine alone", "ms", Stats.of(lib, 1000), Stats.of(floor, 1000),
                direct_label)
        )  # fmt: skip
        bare_label = "the SDK against a bare loop answering the same stream (bench/bare_envd.py)"
        report.rows.append(
            Row(SECTION, "commands.run('true') vs the SDK's own cost", "ms", Stats.of(lib, 1000),
                Stats.of(client, 1000), bare_label)
        )  # fmt: skip
        report.rows.append(_over_floor(lib, client, floor))
    finally:
        await asyncio.to_thread(sbx.kill)


async def _run_code_round_trip(plan: Plan, report: Report, http: httpx.Client, pid: int) -> None:
    """``run_code`` in a live context (its kernel started) against ``commands.run('true')`` in the same sandbox, and
    a pooled sandbox's first ``run_code`` (on its warm kernel) against a kernel started cold in that sandbox."""
    try:
        from e2b_code_interpreter import Sandbox as CodeSandbox
    except ImportError:
        report.notes.append("serve: e2b-code-interpreter is not installed: run_code not measured")
        return
    await asyncio.to_thread(_warm_kernels, http, WARM_KERNELS)
    kernels = [p for p in _tree(pid) if _is_kernel(p)]
    per_kernel = sum(map(_pss_kib, kernels)) / 1024 / max(len(kernels), 1)
    report.notes.append(
        f"serve: a warm kernel costs its pooled {CODE_TEMPLATE} sandbox {per_kernel:.1f} MB (PSS of the kernel's "
        f"processes, {len(kernels)} pooled kernels)"
    )
    warm, cold = [], []
    for _ in range(5):
        await asyncio.to_thread(_warm_kernels, http, 1)
        sbx = await asyncio.to_thread(CodeSandbox.create)
        started = time.perf_counter()
        await asyncio.to_thread(sbx.run_code, "x = 1")
        warm.append(time.perf_counter() - started)
        started = time.perf_counter()
        context = await asyncio.to_thread(sbx.create_code_context)
        await asyncio.to_thread(sbx.run_code, "x = 1", context=context)
        cold.append(time.perf_counter() - started)
        await asyncio.to_thread(sbx.kill)
    label = "create_code_context + its first run_code in that sandbox (a kernel started cold)"
    report.rows.append(_row("first run_code of a new sandbox (warm kernel)", warm, cold, label, 50))
    sbx = await asyncio.to_thread(CodeSandbox.create)
    try:
        await asyncio.to_thread(sbx.run_code, "x = 1")
        report.rows.append(await _new_context(sbx))

        async def run_code() -> None:
            await asyncio.to_thread(sbx.run_code, "x + 1")

        async def run_true() -> None:
            await asyncio.to_thread(sbx.commands.run, "true")

        lib, base = await interleaved([run_code, run_true], plan.serve_iters, plan.warmup // 3)
        name, base_label = "run_code('x + 1') in a live context", "commands.run('true')"
        report.rows.append(Row(SECTION, name, "ms", Stats.of(lib, 1000), Stats.of(base, 1000), base_label))
    finally:
        await asyncio.to_thread(sbx.kill)


async def _new_context(sbx: Any) -> Row:
    """``create_code_context()`` and its first cell in a live sandbox (the kernel starts in the sandbox's session)."""
    took = []
    for _ in range(5):
        started = time.perf_counter()
        context = await asyncio.to_thread(sbx.create_code_context)
        await asyncio.to_thread(sbx.run_code, "x = 1", context=context)
        took.append(time.perf_counter() - started)
        await asyncio.to_thread(sbx.remove_code_context, context)
    return Row(SECTION, "create_code_context + its first run_code", "ms", Stats.of(took, 1000), None, "")


async def _commands_across_sandboxes(sandbox_cls: Any, plan: Plan, report: Report) -> None:
    """``serve_commands`` concurrent ``commands.run('true')`` over ``serve_concurrency`` sandboxes: errors counted."""
    sandboxes = await asyncio.gather(*(sandbox_cls.create() for _ in range(plan.serve_concurrency)))
    try:
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(sandboxes[i % len(sandboxes)].commands.run("true") for i in range(plan.serve_commands)),
            return_exceptions=True,
        )
        elapsed = time.perf_counter() - t0
        errors = [r for r in results if isinstance(r, BaseException)]
        row = Row(
            SECTION,
            f"{plan.serve_commands} concurrent commands.run over {len(sandboxes)} sandboxes",
            "runs/s",
            Stats.of([len(results) / elapsed]),
            None,
            "",
            higher_is_better=True,
        )
        row.target, row.passed = "0 errors", not errors
        row.note = f"{len(errors)} errors" + (f", first: {type(errors[0]).__name__}: {errors[0]}" if errors else "")
        report.rows.append(row)
    finally:
        await asyncio.gather(*(s.kill() for s in sandboxes), return_exceptions=True)


async def _idle_memory(sandbox_cls: Any, pid: int, plan: Plan, report: Report) -> None:
    """What an idle sandbox that has run a command costs: the PSS growth of the server and everything it started
    (in session mode each such sandbox keeps its session: a bwrap and a supervisor)."""
    warm = await asyncio.to_thread(sandbox_cls.create)
    await asyncio.to_thread(warm.commands.run, "true")
    gc.collect()
    before = _tree_pss_kib(pid)
    held = [await asyncio.to_thread(sandbox_cls.create) for _ in range(plan.serve_idle)]
    for sbx in held:
        await asyncio.to_thread(sbx.commands.run, "true")
    per = (_tree_pss_kib(pid) - before) / len(held)
    name = f"memory per idle sandbox after a command ({len(held)} held; PSS, server + its sessions)"
    row = Row(SECTION, name, "KiB", Stats.of([per]), None, "")
    row.target, row.passed = "≤ 5 MB", per <= 5 * 1024
    report.rows.append(row)
    for sbx in [warm, *held]:
        await asyncio.to_thread(sbx.kill)
