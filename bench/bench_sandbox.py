"""Sandbox-backend benchmarks (4): the library against bubblewrap started by hand.

The "bare bwrap" baseline runs the *exact* command line execspace builds
(``build_argv`` on a scratch workspace) with the same process credentials (the
per-workspace uid when we are root), so the difference is what the library adds
around bwrap: environment policy, run directory, supervision, output capture.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import execspace
from bench_core import (
    Plan,
    Report,
    Row,
    Stats,
    Step,
    bare_run,
    concurrent_throughput,
    interleaved,
    leak_checks,
    ok,
    open_fds,
    run_env,
    scratch_dir,
)
from execspace import RunProgramSpec, Workspace
from execspace.backends.sandbox.bwrap import (
    SANDBOX_WORKSPACE,
    BwrapConfig,
    build_argv,
    find_bwrap,
    sandbox_uid,
    visible_path_entries,
)
from execspace.envpolicy import MINIMAL_PATH
from execspace.registry import probe_backend

SECTION = "4 sandbox"
SANDBOX_PYTHON = "/usr/bin/python3"  # /root, /home (pyenv, venvs) are not visible inside


def _sandbox_env() -> dict[str, str]:
    """The environment execspace gives a sandboxed run; without HOME, for one, Python's
    start-up looks the (passwd-less) sandbox uid up through NSS and gets slower."""
    env = run_env(SANDBOX_WORKSPACE)
    env["PATH"] = visible_path_entries(env["PATH"]) or MINIMAL_PATH
    return env


class BareBwrap:
    """bwrap with execspace's argv and uid, spawned directly (no library in between)."""

    def __init__(self, root: Path) -> None:
        bwrap = find_bwrap()
        assert bwrap is not None
        self.as_root = os.geteuid() == 0
        self.ws = root / "ws"
        for d in ("", "work", "skills"):
            (self.ws / d).mkdir(mode=0o755, exist_ok=True)
        (self.ws / "metadata.json").write_text("{}")
        self.kwargs: dict[str, Any] = {"cwd": str(self.ws), "env": _sandbox_env(), "start_new_session": True}
        if self.as_root:
            # the sandbox uid must traverse the root and own the workspace, as execspace arranges
            uid = sandbox_uid(self.ws)
            os.chmod(root, 0o711)
            for d in ("", "work", "skills"):
                os.chown(self.ws / d, uid, uid)
            self.kwargs.update(user=uid, group=uid, extra_groups=[])
        self.cfg = BwrapConfig(bwrap, network=False, host_home=os.environ.get("HOME"))

    def argv(self, cmd: list[str]) -> list[str]:
        return build_argv(self.cfg, self.ws, "work", cmd, as_root_host=self.as_root)

    async def run(self, cmd: list[str]) -> int:
        return await bare_run(self.argv(cmd), **self.kwargs)


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


def _run_quiet(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL)


def _cli_path() -> str | None:
    beside = Path(sys.executable).parent / "execspace"
    return str(beside) if beside.exists() else shutil.which("execspace")


def _sync_step(argv: list[str], label: str) -> Step:
    async def step() -> None:
        proc = _run_quiet(argv)
        ok(proc.returncode, label)

    return step


def _cli_steps(report: Report) -> dict[str, Step]:
    """The one-shot processes to time: the CLI if it works, srt if installed, and the floors."""
    steps: dict[str, Step] = {}
    cli = _cli_path()
    argv = [cli, "run", "--backend", "sandbox", "--", "/bin/true"] if cli else []
    probe = _run_quiet(argv) if argv else None
    if probe is not None and probe.returncode == 0:
        steps["cli"] = _sync_step(argv, "execspace CLI")
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
    """Whole-process cost of the CLI, next to the interpreter start and the library import."""
    steps = _cli_steps(report)
    times = dict(zip(steps, await interleaved(list(steps.values()), plan.cli_iters, 1), strict=True))
    ms = {k: Stats.of(v, 1e3) for k, v in times.items()}
    if "cli" in ms:
        report.rows.append(
            Row(
                SECTION,
                "CLI run --backend sandbox -- /bin/true",
                "ms",
                ms["cli"],
                ms["import"],
                "python -c 'import execspace'",
            )
        )
    if "srt" in ms:
        base, label = (ms["cli"], "execspace CLI") if "cli" in ms else (ms["pass"], "python -c pass")
        report.rows.append(Row(SECTION, "srt /bin/true", "ms", ms["srt"], base, label))
    report.rows.append(Row(SECTION, "python -c 'import execspace'", "ms", ms["import"], ms["pass"], "python -c pass"))


async def run_sandbox(plan: Plan, report: Report, log: Any) -> None:
    probe = await probe_backend("sandbox")
    if not probe.ok:
        report.notes.append(
            f"sandbox benchmarks skipped: {probe.reason}" + (f" (fix: {probe.fix})" if probe.fix else "")
        )
        log(f"4/4 sandbox: skipped ({probe.reason})")
        return
    log("4/4 sandbox")
    with (
        scratch_dir("execspace-bench-sandbox-") as lib_root,
        scratch_dir("execspace-bench-bwrap-") as bare_root,
    ):
        bare = BareBwrap(bare_root)
        async with execspace.open_engine("sandbox", workspace_root=lib_root) as engine:
            ws = await engine.manager.create_workspace("bench/sandbox")
            await _per_run(engine, ws, bare, plan, report)
            await _concurrency(engine, ws, bare, plan, report)
    await _cli(plan, report)
