"""Measurement helpers shared by the benchmarks, and the local-backend benchmarks (1–3).

Every number is compared with a baseline measured in the same process, in the
same run, interleaved with the library's measurement (A B B A …) so that drift
of the machine (frequency scaling, a noisy neighbour, page cache) hits both
sides alike. Timed loops start after a warm-up; results are medians and p90s.
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import execspace
from execspace import EnvPolicy, PutFile, RunProgramSpec, Workspace
from execspace.process.supervisor import RUN_MARKER_VAR
from execspace.workspace.layout import workspace_env

KIB = 1024
MIB = 1024 * KIB


# -- plans ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """How many iterations each benchmark does; ``quick`` trades precision for time."""

    warmup: int = 30
    true_iters: int = 500
    python_iters: int = 100
    concurrency: int = 200
    concurrent_rounds: int = 9
    files: int = 1000
    file_bytes: int = KIB
    file_rounds: int = 7
    big_bytes: int = 64 * MIB
    big_rounds: int = 5
    sandbox_true_iters: int = 200
    sandbox_python_iters: int = 50
    sandbox_concurrency: int = 100
    sandbox_rounds: int = 9
    cli_iters: int = 10
    serve_iters: int = 40
    serve_concurrency: int = 50
    serve_rounds: int = 5
    serve_commands: int = 500
    serve_idle: int = 200

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            warmup=10,
            true_iters=100,
            python_iters=20,
            concurrent_rounds=3,
            file_rounds=3,
            big_rounds=2,
            sandbox_true_iters=40,
            sandbox_python_iters=10,
            sandbox_rounds=3,
            cli_iters=5,
            serve_iters=10,
            serve_rounds=2,
            serve_commands=200,
            serve_idle=50,
        )


# -- statistics and results ---------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    """Median and p90 of samples; ``p90`` is on the *bad* side: the 90th percentile of a
    time, the 10th percentile of a throughput (90 % of the rounds were at least that fast)."""

    median: float
    p90: float
    n: int

    @classmethod
    def of(cls, samples: list[float], scale: float = 1.0, *, higher_is_better: bool = False) -> Stats:
        data = sorted((s * scale for s in samples), reverse=higher_is_better)
        # nearest rank: an observed value, no interpolation between outliers
        p90 = data[max(0, math.ceil(0.9 * len(data)) - 1)]
        return cls(statistics.median(data), p90, len(data))


@dataclass
class Row:
    """One line of the results table: the library against its same-run baseline."""

    section: str
    name: str
    unit: str
    lib: Stats
    base: Stats | None
    base_label: str
    higher_is_better: bool = False
    target: str = ""
    passed: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.base is None or self.base.median == 0:
            return None
        return self.lib.median / self.base.median

    @property
    def delta(self) -> float | None:
        return None if self.base is None else self.lib.median - self.base.median

    def as_json(self) -> dict[str, Any]:
        return {
            "section": self.section,
            "name": self.name,
            "unit": self.unit,
            "execspace": vars(self.lib),
            "baseline": None if self.base is None else vars(self.base),
            "baseline_label": self.base_label,
            "ratio": self.ratio,
            "delta": self.delta,
            "higher_is_better": self.higher_is_better,
            "target": self.target or None,
            "passed": self.passed,
            "note": self.note or None,
        }


@dataclass(frozen=True)
class Check:
    """A non-timing observation with a verdict (e.g. no fd leak)."""

    section: str
    name: str
    value: str
    passed: bool


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


# -- timing ---------------------------------------------------------------------------------

Step = Callable[[], Awaitable[object]]


async def interleaved(steps: list[Step], iters: int, warmup: int) -> list[list[float]]:
    """Time each step once per iteration, order reversed every other iteration (A B C C B A …);
    return the seconds per call of each step."""
    for _ in range(warmup):
        for step in steps:
            await step()
    gc.collect()
    times: list[list[float]] = [[] for _ in steps]
    order = list(enumerate(steps))
    for i in range(iters):
        for k, step in order if i % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            await step()
            times[k].append(time.perf_counter() - t0)
    return times


async def paired(lib: Step, base: Step, iters: int, warmup: int) -> tuple[list[float], list[float]]:
    lib_t, base_t = await interleaved([lib, base], iters, warmup)
    return lib_t, base_t


async def timed(step: Step) -> float:
    t0 = time.perf_counter()
    await step()
    return time.perf_counter() - t0


async def bare_run(argv: list[str], **kwargs: Any) -> int:
    """The baseline: spawn, read both pipes to EOF, wait."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        **kwargs,
    )
    await proc.communicate()
    return proc.returncode or 0


async def backend_ready(name: str, what: str, report: Report, log: Callable[[str], None], **options: Any) -> bool:
    """Probe backend ``name``; when it cannot run here, note why ``what`` (a section) is skipped and say so."""
    from execspace.registry import probe_backend

    probe = await probe_backend(name, **options)
    if not probe.ok:
        report.notes.append(f"{what} skipped: {probe.reason}" + (f" (fix: {probe.fix})" if probe.fix else ""))
        log(f"{what}: skipped ({probe.reason})")
    return probe.ok


def ok(code: int, what: str) -> None:
    # a benchmark of a failing command measures the wrong thing: stop loudly
    if code != 0:
        raise RuntimeError(f"{what} exited with {code}")


# -- process observations -----------------------------------------------------------------


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def child_processes() -> int:
    me = str(os.getpid())
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:
            count += 1
    return count


def leak_checks(section: str, before: int, after: int) -> list[Check]:
    gc.collect()
    after = min(after, open_fds())
    children = child_processes()
    return [
        Check(section, "open fds before/after", f"{before} → {after}", after <= before),
        Check(section, "child processes left", str(children), children == 0),
        Check(section, "threads alive after", str(threading.active_count()), True),
    ]


# -- machine description ------------------------------------------------------------------


def _first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "not available"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else "?"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total() -> str:
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        return f"{kb / MIB:.1f} GiB"
    except (OSError, ValueError, IndexError):
        return "unknown"


def _fs_type(path: str) -> str:
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                _, mnt, fstype, *_ = line.split()
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, fstype
    except OSError:
        pass
    return f"{kind} ({best})" if best else kind


def machine_info() -> dict[str, str]:
    bwrap = shutil.which("bwrap")
    git = ["git", "-C", str(Path(__file__).resolve().parent.parent), "describe", "--always", "--dirty"]
    return {
        "cpu": _cpu_model(),
        "cores": f"{os.cpu_count()} logical, {len(os.sched_getaffinity(0))} usable",
        "memory": _mem_total(),
        "kernel": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})",
        "bwrap": _first_line([bwrap, "--version"]) if bwrap else "not installed",
        "tmp filesystem": f"{tempfile.gettempdir()}: {_fs_type(os.path.realpath(tempfile.gettempdir()))}",
        "load average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "execspace": f"{execspace.__version__} @ {_first_line(git)}",
    }


def python_for_runs() -> str:
    """One interpreter path for library and baseline alike (a shim would add its own cost)."""
    for candidate in ("/usr/bin/python3", sys.executable):
        if os.access(candidate, os.X_OK):
            return candidate
    return sys.executable


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- 1. per-run overhead ------------------------------------------------------------------


def run_env(program_root: str) -> dict[str, str]:
    """The environment execspace gives a run whose workspace the program sees at ``program_root``."""
    env = EnvPolicy().build(os.environ, {}, workspace_env(program_root, "runs/bench"))
    env[RUN_MARKER_VAR] = "0" * 16
    return env


async def bench_run_overhead(engine: execspace.BaseEngine, ws: Workspace, plan: Plan, report: Report) -> None:
    python = python_for_runs()
    assert ws.host_path is not None
    # a second baseline with what the *program* gets from execspace (environment, cwd, own
    # session): the library's Δ against it is the supervisor's own cost
    alike_kw = {"env": run_env(str(ws.host_path)), "cwd": str(ws.host_path / "work"), "start_new_session": True}
    cases = [
        ("/bin/true", ["/bin/true"], plan.true_iters),
        (f"{python} -c pass", [python, "-c", "pass"], plan.python_iters),
    ]
    for label, argv, iters in cases:
        spec = RunProgramSpec(argv[0], argv[1:])

        async def lib(spec: RunProgramSpec = spec, label: str = label) -> None:
            ok((await engine.runner.run_program(ws, spec)).exit_code, label)

        async def base(argv: list[str] = argv, label: str = label) -> None:
            ok(await bare_run(argv), label)

        async def alike(argv: list[str] = argv, label: str = label) -> None:
            ok(await bare_run(argv, **alike_kw), label)

        lib_t, base_t, alike_t = await interleaved([lib, base, alike], iters, plan.warmup)
        lib_s = Stats.of(lib_t, 1e3)
        row = Row("1 local run", label, "ms", lib_s, Stats.of(base_t, 1e3), "bare asyncio subprocess")
        row.target, row.passed = "Δ ≤ 1.5 ms", (row.delta or 0.0) <= 1.5
        report.rows.append(row)
        alike_label = "bare, execspace's env+cwd+setsid"
        report.rows.append(Row("1 local run", f"{label} (same env)", "ms", lib_s, Stats.of(alike_t, 1e3), alike_label))


# -- 2. concurrent runs ---------------------------------------------------------------------


async def concurrent_throughput(lib: Step, base: Step, n: int, rounds: int) -> tuple[list[float], list[float]]:
    """Runs per second of ``n`` concurrent calls of each step, alternating rounds."""

    async def burst(step: Step) -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(step() for _ in range(n)))
        return n / (time.perf_counter() - t0)

    await burst(lib)  # warm-up: thread pool, watcher threads, page cache
    await burst(base)
    gc.collect()
    lib_r: list[float] = []
    base_r: list[float] = []
    for i in range(rounds):
        if i % 2 == 0:
            lib_r.append(await burst(lib))
            base_r.append(await burst(base))
        else:
            base_r.append(await burst(base))
            lib_r.append(await burst(lib))
    return lib_r, base_r


async def bench_concurrency(engine: execspace.BaseEngine, ws: Workspace, plan: Plan, report: Report) -> None:
    spec = RunProgramSpec("/bin/true")

    async def lib() -> None:
        ok((await engine.runner.run_program(ws, spec)).exit_code, "run_program /bin/true")

    async def base() -> None:
        ok(await bare_run(["/bin/true"]), "/bin/true")

    gc.collect()
    fds_before = open_fds()
    lib_r, base_r = await concurrent_throughput(lib, base, plan.concurrency, plan.concurrent_rounds)
    fds_after = open_fds()
    section = "2 concurrency"
    row = Row(
        section,
        f"{plan.concurrency} × /bin/true",
        "runs/s",
        Stats.of(lib_r, higher_is_better=True),
        Stats.of(base_r, higher_is_better=True),
        f"{plan.concurrency} bare asyncio subprocesses",
        higher_is_better=True,
    )
    row.target, row.passed = "≥ 70 % of bare", (row.ratio or 0.0) >= 0.70
    report.rows.append(row)
    report.checks.extend(leak_checks(section, fds_before, fds_after))


# -- 3. staging and collecting -----------------------------------------------------------------


def _small_files(n: int, size: int, prefix: str) -> list[tuple[str, bytes]]:
    line = b"execspace benchmark payload, line of text 0123456789\n"
    body = (line * (size // len(line) + 1))[:size]
    # 100 files per directory: staging real trees creates directories too
    return [(f"{prefix}/d{i // 100:02d}/f{i:04d}.txt", body) for i in range(n)]


def _plain_write(root: Path, files: list[tuple[str, bytes]]) -> None:
    made: set[Path] = set()
    for rel, data in files:
        path = root / rel
        if path.parent not in made:  # what straightforward code does: each directory once
            path.parent.mkdir(parents=True, exist_ok=True)
            made.add(path.parent)
        with open(path, "wb") as f:
            f.write(data)


def _plain_read(top: Path) -> int:
    count = 0
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in sorted(filenames):
            with open(os.path.join(dirpath, name), "rb") as f:
                f.read()
            count += 1
    return count


class StagingBench:
    """put_files/collect of one file set against plain open() in a temp dir, round after round."""

    def __init__(self, engine: execspace.BaseEngine, ws: Workspace, plain_root: Path) -> None:
        assert ws.host_path is not None, "staging is measured on host workspaces"
        self.engine, self.ws, self.plain_root, self.lib_root = engine, ws, plain_root, ws.host_path
        self.times: dict[str, list[float]] = {k: [] for k in ("put", "plain_write", "collect", "plain_read")}

    async def round(self, files: list[tuple[str, bytes]], top: str, expect: int, first_lib: bool) -> None:
        fs = self.engine.fs
        puts = [PutFile(rel, data) for rel, data in files]
        limit = max(len(d) for _, d in files) + 1

        async def put() -> None:
            await fs.put_files(self.ws, puts)

        async def plain_write() -> None:
            _plain_write(self.plain_root, files)

        async def collect() -> None:
            got = await fs.collect(
                self.ws, [f"{top}/**"], max_files=expect, max_file_bytes=limit, max_total_bytes=limit * expect
            )
            ok(0 if len(got) == expect and not any(f.truncated for f in got) else 1, f"collect {top}")

        async def plain_read() -> None:
            ok(0 if _plain_read(self.plain_root / top) == expect else 1, f"read {top}")

        pairs = [
            (("put", put), ("plain_write", plain_write)),
            (("collect", collect), ("plain_read", plain_read)),
        ]
        for pair in pairs:
            for key, step in pair if first_lib else pair[::-1]:
                self.times[key].append(await timed(step))
        shutil.rmtree(self.lib_root / top)
        shutil.rmtree(self.plain_root / top)

    def rows(self, label: str, target: bool) -> list[Row]:
        out = []
        for lib_key, base_key, what in (
            ("put", "plain_write", "put_files"),
            ("collect", "plain_read", "collect"),
        ):
            row = Row(
                "3 staging",
                f"{what} {label}",
                "ms",
                Stats.of(self.times[lib_key][1:], 1e3),  # first round is the warm-up
                Stats.of(self.times[base_key][1:], 1e3),
                "plain open() write" if lib_key == "put" else "plain os.walk + open() read",
            )
            if target:
                row.target, row.passed = "≤ 500 ms", row.lib.median <= 500
            out.append(row)
        return out


async def bench_staging(engine: execspace.BaseEngine, ws: Workspace, plan: Plan, report: Report) -> None:
    big = os.urandom(plan.big_bytes)
    with scratch_dir("execspace-bench-plain-") as plain_root:
        many = StagingBench(engine, ws, plain_root)
        for i in range(plan.file_rounds + 1):
            top = f"work/many{i}"
            await many.round(_small_files(plan.files, plan.file_bytes, top), top, plan.files, i % 2 == 0)
        report.rows.extend(many.rows(f"{plan.files:,} × {plan.file_bytes // KIB} KiB", target=True))
        gc.collect()
        large = StagingBench(engine, ws, plain_root)
        for i in range(plan.big_rounds + 1):
            top = f"work/big{i}"
            await large.round([(f"{top}/blob.bin", big)], top, 1, i % 2 == 0)
        report.rows.extend(large.rows(f"1 × {plan.big_bytes // MIB} MiB", target=False))


# -- entry -------------------------------------------------------------------------------------


async def run_core(plan: Plan, report: Report, log: Callable[[str], None]) -> None:
    with scratch_dir("execspace-bench-local-") as root:
        async with execspace.open_engine("local", workspace_root=root / "ws") as engine:
            ws = await engine.manager.create_workspace("bench/local")
            log("1/4 per-run overhead (local)")
            await bench_run_overhead(engine, ws, plan, report)
            log("2/4 concurrent runs (local)")
            await bench_concurrency(engine, ws, plan, report)
            log("3/4 staging and collecting")
            await bench_staging(engine, ws, plan, report)
