"""Run every execspace benchmark and print a table (``./run bench [--quick] [--json FILE]``).

Each number is compared with a baseline measured in the same run; see bench/README.md.
Targets are reported as PASS/MISS, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_cluster import run_cluster
from bench_container import run_container
from bench_core import Plan, Report, Row, machine_info, run_core
from bench_e2b import run_e2b
from bench_egress import run_egress
from bench_idle import run_idle
from bench_inject import run_inject
from bench_jupyter import run_jupyter
from bench_mcp import run_mcp
from bench_metrics import run_metrics
from bench_sandbox import run_sandbox
from bench_serve import run_serve
from bench_tracing import run_tracing


def _num(value: float, unit: str) -> str:
    if unit == "runs/s":
        return f"{value:,.0f}"
    return f"{value:.3g}" if value < 100 else f"{value:,.0f}"


def _ratio(row: Row) -> str:
    r = row.ratio
    if r is None:
        return "-"
    return f"{r * 100:.0f} %" if row.higher_is_better else f"{r:.2f}×"


def _delta(row: Row) -> str:
    d = row.delta
    if d is None:
        return "-"
    return f"{d:+,.0f}/s" if row.unit == "runs/s" else f"{d:+.3g} {row.unit}"


def _verdict(row: Row) -> str:
    return "" if row.passed is None else ("PASS" if row.passed else "MISS")


def render_table(rows: list[Row]) -> str:
    head = [
        "section",
        "benchmark",
        "unit",
        "execspace med",
        "p90",
        "baseline med",
        "p90",
        "ratio",
        "Δ med",
        "target",
        "",
        "baseline",
    ]
    lines = [head]
    for r in rows:
        base_med = _num(r.base.median, r.unit) if r.base else "-"
        base_p90 = _num(r.base.p90, r.unit) if r.base else "-"
        lines.append(
            [
                r.section,
                r.name,
                r.unit,
                _num(r.lib.median, r.unit),
                _num(r.lib.p90, r.unit),
                base_med,
                base_p90,
                _ratio(r),
                _delta(r),
                r.target,
                _verdict(r),
                r.base_label,
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    numeric = {3, 4, 5, 6, 7, 8}
    out = []
    for n, line in enumerate(lines):
        cells = [c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def print_report(machine: dict[str, str], command: str, report: Report, elapsed: float) -> None:
    print("execspace benchmarks")
    print(f"command: {command}")
    for key, value in machine.items():
        print(f"  {key + ':':<16} {value}")
    print()
    print(render_table(report.rows))
    print("(p90 is on the bad side: 90th percentile of a time, 10th percentile of a throughput)")
    if report.checks:
        print()
        for c in report.checks:
            print(f"  [{'ok' if c.passed else 'FAIL'}] {c.section}: {c.name}: {c.value}")
    if report.notes or report.failed:
        print()
        for note in report.notes:
            print(f"  note: {note}")
        for failure in report.failed:
            print(f"  FAILED: {failure}")
    targets = [r for r in report.rows if r.passed is not None]
    missed = [r for r in targets if not r.passed]
    print()
    print(
        f"targets: {len(targets) - len(missed)}/{len(targets)} met"
        + (f"; missed: {', '.join(r.name for r in missed)}" if missed else "")
    )
    print(f"elapsed: {elapsed:.1f} s")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer iterations (~4× faster, noisier)")
    p.add_argument("--json", metavar="FILE", type=Path, help="also write the numbers as JSON to FILE")
    groups = ("core", "sandbox", "jupyter", "container", "serve", "e2b", "egress", "inject", "mcp", "cluster")
    groups += ("tracing", "metrics", "idle")
    p.add_argument("--only", choices=groups, help="run one group of benchmarks")
    return p.parse_args(argv)


async def run(args: argparse.Namespace, report: Report) -> None:
    plan = Plan.quick() if args.quick else Plan()

    def log(msg: str) -> None:
        print(f"... {msg}", file=sys.stderr, flush=True)

    groups = {
        "core": run_core,
        "sandbox": run_sandbox,
        "jupyter": run_jupyter,
        "container": run_container,
        "serve": run_serve,
        "e2b": run_e2b,
        "egress": run_egress,
        "inject": run_inject,
        "mcp": run_mcp,
        "cluster": run_cluster,
        "tracing": run_tracing,
        "metrics": run_metrics,
        "idle": run_idle,
    }
    for name, group in groups.items():
        if args.only not in (None, name):
            continue
        try:
            await group(plan, report, log)
        except Exception as exc:  # one broken group must not lose the others' numbers
            report.failed.append(f"{name} benchmarks failed: {type(exc).__name__}: {exc}")
            log(report.failed[-1])
            traceback.print_exc(file=sys.stderr)  # where it broke, for whoever fixes it


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    command = shlex.join(["./run", "bench", *(sys.argv[1:] if argv is None else argv)])
    machine = machine_info()
    report = Report()
    t0 = time.perf_counter()
    asyncio.run(run(args, report))
    elapsed = time.perf_counter() - t0
    # other work on the machine skews both sides of a ratio less than absolute numbers; show it
    machine["load average"] += " at start; " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + " at end"
    print_report(machine, command, report, elapsed)
    if args.json:
        plan = Plan.quick() if args.quick else Plan()
        doc = {
            "command": command,
            "machine": machine,
            "plan": asdict(plan),
            "rows": [r.as_json() for r in report.rows],
            "checks": [asdict(c) for c in report.checks],
            "notes": report.notes,
            "failed": report.failed,
            "elapsed_s": elapsed,
        }
        args.json.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
