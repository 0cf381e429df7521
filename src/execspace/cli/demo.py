"""``execspace demo``: stage a CSV, analyse it in a workspace, collect a summary and a chart.

Everything the demo shows is real: the CSV is staged as an input, a stdlib-only
Python script runs in the workspace on the chosen backend, and ``out/`` is
collected with the same calls an agent would make.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import secrets
import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..capabilities import Capabilities
from ..engine import BaseEngine, open_engine
from ..errors import SetupFailed, UsageError
from ..models import File, InputSpec, OutputManifest, OutputSpec, PutFile, ResourceLimits, RunProgramSpec, Workspace
from ..registry import DEFAULT_ORDER, choose_default_backend
from ..workspace import ConfinedRoot
from .console import human_size, progress, warn_if_unisolated

if TYPE_CHECKING:
    from .demo_analysis import Summary

__all__ = ["DEMO_DAYS", "REGIONS", "add_parser", "command", "sales_csv"]

DEMO_DAYS = 60
REGIONS = ("north", "south", "east", "west")
CSV_DEST = "work/inputs/sales.csv"
SCRIPT_DEST = "work/analyze.py"
_DEMO_ID = "execspace/demo/sales"
_MEMORY = 1024 * 2**20  # generous for python3 under RLIMIT_AS, still a real cap


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="analyse a small CSV in a workspace and collect the results",
        description="Stage a CSV, analyse it in a workspace, collect out/summary.json and out/chart.svg.",
    )
    p.add_argument("--backend", help="backend to use (default: the safest that works; local if none isolates)")
    p.add_argument(
        "--keep-dir",
        type=Path,
        default=Path("execspace-demo"),
        metavar="DIR",
        help="where the demo's files are copied, yours to keep: its input, script and out/ (default ./execspace-demo)",
    )
    p.set_defaults(handler=command)


def sales_csv(days: int = DEMO_DAYS) -> bytes:
    """Daily temperature and sales, deterministic: integer arithmetic, no randomness."""
    start = dt.date(2024, 3, 1)
    lines = ["date,region,temperature_c,sales"]
    for i in range(days):
        tenths = 60 + (i * 37) % 110 + 2 * i  # a warming trend with a wobble
        sales = 200 + (i * 53) % 120 + tenths // 5  # warmer days sell more
        day = start + dt.timedelta(days=i)
        lines.append(f"{day.isoformat()},{REGIONS[i % len(REGIONS)]},{tenths / 10:.1f},{sales}")
    return ("\n".join(lines) + "\n").encode()


def analysis_source() -> str:
    return resources.files("execspace.cli").joinpath("demo_analysis.py").read_text(encoding="utf-8")


async def pick_backend(requested: str | None) -> str:
    if requested:
        return requested
    progress(f"looking for an isolating backend ({', '.join(DEFAULT_ORDER)})...")
    try:
        return await choose_default_backend()
    except SetupFailed as exc:
        progress(str(exc))
        print(
            "\n*** No isolating backend works on this host. Because this is the demo, which runs only its\n"
            "*** own fixed script, it falls back to --backend local explicitly: NO isolation.\n"
            "*** For untrusted code, fix a sandbox backend instead (see `execspace doctor`).\n",
            file=sys.stderr,
            flush=True,
        )
        return "local"


def _spec(caps: Capabilities) -> RunProgramSpec:
    # ask for every protection the backend can enforce: asking for more would be refused
    memory = _MEMORY if "memory_bytes" in caps.enforced_limits else None
    return RunProgramSpec(
        "python3",
        ["analyze.py", "inputs/sales.csv"],
        timeout=60,
        limits=ResourceLimits(memory_bytes=memory),
        network="off" if caps.network_control else None,
    )


async def _analyse(engine: BaseEngine, ws: Workspace) -> OutputManifest | None:
    progress(f"staging {CSV_DEST} ({DEMO_DAYS} days of sales) and {SCRIPT_DEST}...")
    await engine.fs.stage_inputs(ws, [InputSpec(sales_csv(), dest=CSV_DEST)])
    await engine.fs.put_files(ws, [PutFile(SCRIPT_DEST, analysis_source())])
    progress("running python3 analyze.py in the workspace...")
    result = await engine.runner.run_program(ws, _spec(engine.describe()))
    if not result.ok:
        sys.stderr.write(result.stdout + result.stderr)
        progress(f"the analysis failed (exit {result.exit_code}, timed out: {result.timed_out})")
        return None
    progress("collecting out/...")
    return await engine.fs.collect_outputs(ws, OutputSpec(globs=["out/**"]))


async def command(args: argparse.Namespace) -> int:
    keep_dir = _destination(args.keep_dir)
    name = await pick_backend(args.backend)
    progress(f"opening backend {name!r}...")
    async with open_engine(name) as engine:
        caps = engine.describe()
        warn_if_unisolated(caps)
        # a workspace of the engine's own (as root, a sandbox uid owns it), removed after; the user gets copies
        ws = await engine.manager.create_workspace(f"{_DEMO_ID}/{secrets.token_hex(4)}")
        try:
            manifest = await _analyse(engine, ws)
            if manifest is None:
                return 1
            files = await engine.fs.collect(ws, [CSV_DEST, SCRIPT_DEST, "out/**"])
            summary: Summary = json.loads((await engine.fs.read_file(ws, "out/summary.json")).content)
        finally:
            await engine.manager.cleanup(ws)
    await asyncio.to_thread(_copy, files, keep_dir)
    sys.stdout.write(render(caps, keep_dir, manifest, summary))
    sys.stdout.flush()
    return 0


def _destination(path: Path) -> Path:
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--keep-dir {path}: exists and is not a directory; pass a new or existing directory")
    return path.absolute()


def _copy(files: list[File], dest: Path) -> None:
    """The demo's files under ``dest`` at their workspace paths, written by this process: the user's own."""
    dest.mkdir(parents=True, exist_ok=True)
    with ConfinedRoot(str(dest)) as root:
        for f in files:
            if f.skipped is None:
                root.write_file(f.name, f.content)


def render(caps: Capabilities, kept: Path, manifest: OutputManifest, summary: Summary) -> str:
    """The report of a demo run whose files were copied to ``kept``; ``summary``: what our analysis program wrote
    (demo_analysis.py)."""
    totals = ", ".join(f"{region} {total}" for region, total in summary["by_region"].items())
    lines = [
        f"execspace demo: backend {caps.backend!r}, isolation: {caps.isolation}",
        "",
        f"analysed {summary['count']} days ({summary['first_date']} .. {summary['last_date']}): "
        f"sales mean {summary['mean']}, min {summary['min']}, max {summary['max']}",
        f"sales by region: {totals}",
        "",
        "outputs:",
    ]
    width = max((len(f.name) for f in manifest.files), default=0)
    for f in manifest.files:
        lines.append(f"  {f.name.ljust(width)}  {human_size(f.size_bytes):>9}  {f.mime_type}")
    lines += ["", "on this host (yours to keep):"]
    lines += [f"  {kept / f.name}" for f in manifest.files]
    lines.append(f"copied to {kept} (input {CSV_DEST}, script {SCRIPT_DEST}); the workspace was removed")
    return "\n".join(lines) + "\n"
