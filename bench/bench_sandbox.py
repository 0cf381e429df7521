"""Sandbox-backend benchmarks (4): the library against bubblewrap started by hand.

The "bare bwrap" baseline spawns the *exact* process execspace would: the
runner's own ``preparation.prepare`` and ``wrap`` (which calls ``bwrap.build_argv``) build the
launch once, before timing, on a second workspace of the same engine; every
baseline run then spawns that argv with the same environment, cwd, uid/gid (the
per-workspace sandbox uid when we are root) and seccomp filter, and nothing
else. The difference is what the library adds around bwrap per run: environment
policy, run directory, argv building, supervision, output capture.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import execspace
from bench_core import (
    Plan,
    Report,
    Row,
    Stats,
    Step,
    backend_ready,
    bare_run,
    concurrent_throughput,
    interleaved,
    leak_checks,
    ok,
    open_fds,
    scratch_dir,
)
from execspace import RunProgramSpec, Workspace

SECTION = "4 sandbox"
SANDBOX_PYTHON = "/usr/bin/python3"  # /root, /home (pyenv, venvs) are not visible inside


class BareBwrap:
    """Spawns the launches execspace builds, directly: no library code runs per spawn."""

    def __init__(self, runner: Any, ws: Workspace) -> None:
        self.runner, self.ws = runner, ws
        self.launches: dict[tuple[str, ...], Any] = {}

    def launch(self, cmd: list[str]) -> Any:
        key = tuple(cmd)
        if key not in self.launches:
            prep = self.runner.preparation.prepare(self.ws, RunProgramSpec(cmd[0], cmd[1:]))
            self.launches[key] = self.runner.wrap(prep)
        return self.launches[key]

    @property
    def seccomp(self) -> bool:
        return any("--seccomp" in la.argv for la in self.launches.values())

    async def run(self, cmd: list[str]) -> int:
        la = self.launch(cmd)
        argv, pass_fds, fresh = list(la.argv), list(la.pass_fds), []
        if "--seccomp" in argv:
            # bwrap reads the filter to EOF: each run needs its own file offset, so reopen the memfd
            at = argv.index("--seccomp") + 1
            fresh.append(os.open(f"/proc/self/fd/{argv[at]}", os.O_RDONLY | os.O_CLOEXEC))
            argv[at] = str(fresh[0])
            pass_fds = [fd for fd in pass_fds if str(fd) != la.argv[at]] + fresh
        kwargs: dict[str, Any] = {}
        if la.user is not None:
            kwargs.update(user=la.user, group=la.group, extra_groups=[])
        if la.preexec_fn is not None:
            kwargs["preexec_fn"] = la.preexec_fn
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=dict(la.env),
                cwd=la.cwd,
                start_new_session=True,
                pass_fds=pass_fds,
                **kwargs,
            )
        finally:
            for fd in fresh:
                os.close(fd)
        await proc.communicate()
        return proc.returncode or 0

    def close(self) -> None:
        for la in self.launches.values():
            for hook in la.after_spawn:  # closes the fds the runner opened for the child
                hook()
        self.launches.clear()


async def _per_run(engine: execspace.BaseEngine, ws: Workspace, bare: BareBwrap, plan: Plan, report: Report) -> None:
    cases = [("/bin/true", ["/bin/true"], plan.sandbox_true_iters)]
    if os.access(SANDBOX_PYTHON, os.X_OK):
        cases.append((f"{SANDBOX_PYTHON} -c pass", [SANDBOX_PYTHON, "-c", "pass"], plan.sandbox_python_iters))
    else:
        report.notes.append(f"sandbox: {SANDBOX_PYTHON} not found, python case skipped")
    for label, cmd, iters in cases:
        spec = RunProgramSpec(cmd[0], cmd[1:])

        async def lib(spec: RunProgramSpec = spec, label: str = label) -> None:
            ok((await engine.runner.run_program(ws, spec)).exit_code, f"sandboxed {label}")

        async def wrapped(cmd: list[str] = cmd, label: str = label) -> None:
            ok(await bare.run(cmd), f"bare bwrap {label}")

        async def plain(cmd: list[str] = cmd, label: str = label) -> None:
            ok(await bare_run(cmd), label)

        lib_t, bwrap_t, plain_t = await interleaved([lib, wrapped, plain], iters, plan.warmup)
        row = Row(
            SECTION,
            f"run {label}",
            "ms",
            Stats.of(lib_t, 1e3),
            Stats.of(bwrap_t, 1e3),
            "bare bwrap, same argv",
        )
        row.target, row.passed = "≤ 1.5× bare bwrap", (row.ratio or 0.0) <= 1.5
        report.rows.append(row)
        report.rows.append(
            Row(
                SECTION,
                f"bare bwrap {label}",
                "ms",
                Stats.of(bwrap_t, 1e3),
                Stats.of(plain_t, 1e3),
                "bare, no sandbox",
            )
        )


async def _concurrency(
    engine: execspace.BaseEngine, ws: Workspace, bare: BareBwrap, plan: Plan, report: Report
) -> None:
    spec = RunProgramSpec("/bin/true")

    async def lib() -> None:
        ok((await engine.runner.run_program(ws, spec)).exit_code, "sandboxed /bin/true")

    async def wrapped() -> None:
        ok(await bare.run(["/bin/true"]), "bare bwrap /bin/true")

    gc.collect()
    fds_before = open_fds()
    lib_r, base_r = await concurrent_throughput(lib, wrapped, plan.sandbox_concurrency, plan.sandbox_rounds)
    fds_after = open_fds()
    row = Row(
        SECTION,
        f"{plan.sandbox_concurrency} × /bin/true concurrent",
        "runs/s",
        Stats.of(lib_r, higher_is_better=True),
        Stats.of(base_r, higher_is_better=True),
        f"{plan.sandbox_concurrency} bare bwrap concurrent",
        higher_is_better=True,
    )
    row.target, row.passed = "≥ 150 runs/s", row.lib.median >= 150
    report.rows.append(row)
    report.checks.extend(leak_checks(SECTION, fds_before, fds_after))


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def _idle_memory(engine: execspace.BaseEngine, report: Report, count: int = 200) -> None:
    """What an open, idle sandboxed workspace costs: this process's RSS growth per workspace.

    A sandboxed workspace holds no process between runs (each run is a fresh bwrap), so
    the cost is the handle and the directory; the row shows it is well under the target.
    """
    # warm up the code paths so that first-use allocations are not charged to the workspaces
    await engine.runner.run_program(
        await engine.manager.create_workspace("bench/idle-warm"), RunProgramSpec("/bin/true")
    )
    gc.collect()
    before = _rss_kib()
    held = [await engine.manager.create_workspace(f"bench/idle/{i}") for i in range(count)]
    gc.collect()
    per_ws = (_rss_kib() - before) / count
    row = Row(SECTION, f"idle memory per open workspace ({len(held)} held)", "KiB", Stats.of([per_ws]), None, "")
    row.target, row.passed = "≤ 1 MB", per_ws <= 1024
    report.rows.append(row)


# as a user runs it: bytecode caches in use (some shells export PYTHONDONTWRITEBYTECODE, which makes
# every start recompile the sources and would charge that to execspace)
_USER_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _run_quiet(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL, env=env or _USER_ENV
    )


def _cli_path() -> str | None:
    beside = Path(sys.executable).parent / "execspace"
    return str(beside) if beside.exists() else shutil.which("execspace")


def _sync_step(argv: list[str], label: str, env: dict[str, str] | None = None) -> Step:
    async def step() -> None:
        proc = _run_quiet(argv, env)
        ok(proc.returncode, label)

    return step


@contextlib.contextmanager
def _warm_daemon(cli: str, report: Report) -> Iterator[dict[str, str] | None]:
    """A private `execspace daemon` for the duration; yields the environment that reaches it."""
    # a short directory: a unix socket path must fit in 107 bytes
    with tempfile.TemporaryDirectory(prefix="xdg", dir="/tmp") as runtime:
        env = {**_USER_ENV, "XDG_RUNTIME_DIR": runtime}
        started = time.perf_counter()
        proc = _run_quiet([cli, "daemon", "start"], env)
        if proc.returncode != 0:
            report.notes.append(f"execspace daemon did not start: {proc.stderr.strip()[-200:]}")
            yield None
            return
        report.notes.append(
            f"`execspace daemon start` (once, not in the rows): {1e3 * (time.perf_counter() - started):.0f} ms"
        )
        try:
            yield env
        finally:
            _run_quiet([cli, "daemon", "stop"], env)


def _cli_steps(report: Report, cli: str | None, daemon_env: dict[str, str] | None) -> dict[str, Step]:
    """The one-shot processes to time: the CLI if it works (here and via the daemon), srt if installed, the floors."""
    steps: dict[str, Step] = {}
    argv = [cli, "run", "--backend", "sandbox", "--", "/bin/true"] if cli else []
    here = {**_USER_ENV, "EXECSPACE_DAEMON": "off"}
    probe = _run_quiet(argv, here) if argv else None
    if probe is not None and probe.returncode == 0:
        steps["cli"] = _sync_step(argv, "execspace CLI", here)
        if daemon_env is not None:
            steps["daemon"] = _sync_step(argv, "execspace CLI via daemon", daemon_env)
    else:
        why = "execspace script not found" if probe is None else (probe.stderr.strip().splitlines() or ["?"])[-1]
        report.notes.append(f"CLI `execspace run --backend sandbox -- /bin/true` not measured: {why}")
    srt = shutil.which("srt")
    if srt is None:
        report.notes.append("srt (@anthropic-ai/sandbox-runtime) is not installed: no comparison")
    else:
        steps["srt"] = _sync_step([srt, "/bin/true"], "srt")
    steps["import"] = _sync_step([sys.executable, "-c", "import execspace"], "import execspace")
    steps["pass"] = _sync_step([sys.executable, "-c", "pass"], "python -c pass")
    return steps


async def _cli(plan: Plan, report: Report) -> None:
    """Whole-process cost of the CLI, next to srt, the interpreter start and the library import."""
    cli = _cli_path()
    with _warm_daemon(cli, report) if cli else contextlib.nullcontext(None) as daemon_env:
        steps = _cli_steps(report, cli, daemon_env)
        times = dict(zip(steps, await interleaved(list(steps.values()), plan.cli_iters, 1), strict=True))
    ms = {k: Stats.of(v, 1e3) for k, v in times.items()}
    base, label = (ms["srt"], "srt /bin/true") if "srt" in ms else (ms["pass"], "python -c pass")
    # the target is the whole command against srt; the daemon is what meets it, so only that row is judged
    for key, name in (("daemon", "warm daemon"), ("cli", "no daemon")):
        if key in ms:
            row = Row(SECTION, f"CLI run --backend sandbox -- /bin/true ({name})", "ms", ms[key], base, label)
            if key == "daemon" and "srt" in ms:
                row = replace(row, target="≤ 0.2× srt", passed=ms[key].median <= 0.2 * base.median)
            report.rows.append(row)
    if "srt" in ms:
        report.rows.append(Row(SECTION, "srt /bin/true", "ms", ms["srt"], ms["pass"], "python -c pass"))
    report.rows.append(Row(SECTION, "python -c 'import execspace'", "ms", ms["import"], ms["pass"], "python -c pass"))


async def run_sandbox(plan: Plan, report: Report, log: Any) -> None:
    if not await backend_ready("sandbox", "4/4 sandbox benchmarks", report, log):
        return
    log("4/4 sandbox")
    with scratch_dir("execspace-bench-sandbox-") as root:
        async with execspace.open_engine("sandbox", workspace_root=root) as engine:
            ws = await engine.manager.create_workspace("bench/sandbox")
            bare = BareBwrap(engine.runner, await engine.manager.create_workspace("bench/bare-bwrap"))
            try:
                await _per_run(engine, ws, bare, plan, report)
                await _concurrency(engine, ws, bare, plan, report)
                await _idle_memory(engine, report)
                if bare.seccomp:
                    report.notes.append("sandbox: library and bare bwrap both load execspace's seccomp filter")
            finally:
                bare.close()
    await _cli(plan, report)
