"""Metrics and audit benchmarks (16): what ``--metrics`` and ``--audit-log`` add to a command's round trip.

Three ``execspace serve`` subprocesses on the sandbox backend, one sandbox each: ``--metrics off`` (the baseline),
``--metrics open``, and ``--metrics open --audit-log FILE``; the official SDK's ``commands.run('true')`` on each,
interleaved in one process. A command is two events (start and end), so two counter updates and two audit lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench_core import Plan, Report, Row, Stats, backend_ready, interleaved, scratch_dir
from execspace.testing.binding import make_traversable
from execspace.testing.processes import read_until, terminate

SECTION = "16 metrics"
KEY = "e2b_" + "0123456789abcdef" * 2


@contextlib.contextmanager
def _server(root: Path, *flags: str) -> Iterator[str]:
    make_traversable(root)
    argv = [sys.executable, "-m", "execspace", "serve", "--port", "0", "--api-key", KEY, "--workspace-root", str(root)]
    argv += ["--pool-size", "0", "--no-warm-kernels", *flags]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        found, seen = read_until(proc.stdout, rb"listening on (\S+)", 30)
        if found is None:
            raise RuntimeError(f"execspace serve did not start: {seen.decode(errors='replace')[-300:]}")
        yield found.group(1).decode()
    finally:
        terminate(proc)


async def run_metrics(plan: Plan, report: Report, log: Callable[[str], None]) -> None:
    try:
        from e2b import Sandbox
    except ImportError:
        report.notes.append("metrics benchmarks skipped: pip install 'execspace[dev]' (the e2b SDK)")
        return
    if not await backend_ready("sandbox", SECTION, report, log):
        return
    log("metrics: commands.run('true') with metrics off, on, and on with the audit log")
    with (
        scratch_dir("bench-metrics-off-") as off_root,
        scratch_dir("bench-metrics-on-") as on_root,
        scratch_dir("bench-metrics-audit-") as audit_root,
        scratch_dir("bench-metrics-log-") as log_dir,
        _server(off_root, "--metrics", "off") as off_url,
        _server(on_root, "--metrics", "open") as on_url,
        _server(audit_root, "--metrics", "open", "--audit-log", str(log_dir / "audit.jsonl")) as audit_url,
    ):
        made: list[Any] = []
        try:
            for url in (off_url, on_url, audit_url):
                made.append(await asyncio.to_thread(Sandbox.create, api_key=KEY, api_url=url, sandbox_url=url))

            def step(sbx: Any) -> Callable[[], Any]:
                async def run_true() -> None:
                    await asyncio.to_thread(sbx.commands.run, "true")

                return run_true

            off, on, audited = await interleaved([step(s) for s in made], plan.serve_iters, plan.warmup // 3)
        finally:
            for sbx in made:
                await asyncio.to_thread(sbx.kill)
    for name, lib in (("--metrics open", on), ("--metrics open --audit-log FILE", audited)):
        row = Row(
            SECTION, f"commands.run('true'), {name}", "ms", Stats.of(lib, 1000), Stats.of(off, 1000), "--metrics off",
            target="≤ +5 %",
        )  # fmt: skip
        row.passed = row.ratio is not None and row.ratio <= 1.05
        report.rows.append(row)
