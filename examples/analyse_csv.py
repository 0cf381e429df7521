"""Analyse a CSV with an agent and get the chart back.

    python examples/analyse_csv.py                                   # a scripted model: no key, no network
    python examples/analyse_csv.py --base-url https://api.openai.com/v1 --model gpt-4.1-mini   # OPENAI_API_KEY

The CSV goes into a sandboxed workspace (work/inputs/), the model works there with execspace's tools
(workspace_exec, execute_code), and the chart it writes to out/ is copied next to you (--out-dir).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import execspace
from execspace.agent import Agent, ChatCompletions, workspace_tools
from execspace.testing.chatmodel import ScriptedChatServer, ScriptedReply, last_tool_result, text, tool_call
from execspace.tools import WorkspaceIO

SALES = "month,region,revenue\n" + "".join(
    f"2026-{m:02d},{region},{(m * 37 + len(region) * 11) % 90 + 10}\n"
    for m in range(1, 7)
    for region in ("north", "south")
)
PROMPT = (
    "work/inputs/sales.csv has columns month, region, revenue. Total the revenue per month, tell me the best "
    "month, and draw a bar chart of the totals to out/chart.svg."
)
# what the scripted model "writes": plain Python, so it runs on any interpreter the sandbox has
ANALYSIS = """
import csv, collections
totals = collections.OrderedDict()
for row in csv.DictReader(open("inputs/sales.csv")):
    totals[row["month"]] = totals.get(row["month"], 0) + int(row["revenue"])
best = max(totals, key=totals.get)
bars, top = [], max(totals.values())
for i, (month, total) in enumerate(totals.items()):
    h = 200 * total / top
    bars.append(f'<rect x="{20 + i * 60}" y="{220 - h:.0f}" width="40" height="{h:.0f}" fill="steelblue"/>'
                f'<text x="{20 + i * 60}" y="240" font-size="10">{month}</text>')
open("../out/chart.svg", "w").write('<svg xmlns="http://www.w3.org/2000/svg" width="400" height="250">'
                                    + "".join(bars) + "</svg>")
print(dict(totals)); print("best:", best, totals[best])
"""


def scripted_replies() -> list[ScriptedReply]:
    return [
        tool_call("workspace_exec", {"command": "head -3 inputs/sales.csv && wc -l inputs/sales.csv"}),
        tool_call("execute_code", {"language": "python", "code": ANALYSIS}),
        lambda request: text("Monthly totals and the best month: " + last_tool_result(request)["output"].strip()),
    ]


@contextlib.contextmanager
def model_endpoint(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    if args.base_url:
        yield args.base_url, args.model
        return
    with ScriptedChatServer(scripted_replies()) as server:
        yield server.base_url, "scripted"


async def analyse(args: argparse.Namespace, backend: str | None, **options: object) -> list[str]:
    """One agent turn on ``backend``; the paths of the charts it wrote (copied to ``args.out_dir``)."""
    workspace = "examples/csv/session-1"
    with model_endpoint(args) as (base_url, model_name):
        async with (
            execspace.open_engine(backend, **options) as engine,
            workspace_tools(engine, workspace) as tools,
            ChatCompletions(base_url, model=model_name) as model,
        ):
            io = await WorkspaceIO.open(engine, workspace)
            await io.put("work/inputs/sales.csv", SALES)
            agent = Agent(model, tools, system="You are a data analyst. Work in the workspace with the tools.")
            async for event in agent.stream(PROMPT):
                if event.kind == "tool_call":
                    print(f"-> {event.name} {(event.arguments or '')[:100]}")
                elif event.kind == "tool_result" and event.result is not None:
                    print(f"<- {event.name}: {event.result.get('status')}")
                elif event.kind in ("final", "stopped"):
                    print(f"\n{event.text}")
            charts = await io.collect(["out/*.svg", "out/*.png"])
            args.out_dir.mkdir(parents=True, exist_ok=True)
            saved = []
            for chart in charts:
                target = args.out_dir / Path(chart.name).name
                target.write_bytes(chart.content)
                saved.append(str(target))
                print(f"chart: {target} ({chart.mime_type}, {chart.size_bytes} bytes, backend {engine.name})")
            await engine.manager.cleanup(io.workspace)
    return saved


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default=None, help="default: the safest backend that works here")
    p.add_argument("--base-url", help="an OpenAI-compatible endpoint (default: the scripted model)")
    p.add_argument("--model", default="gpt-4.1-mini")
    p.add_argument("--out-dir", type=Path, default=Path("."))
    return p


if __name__ == "__main__":
    arguments = parser().parse_args()
    sys.exit(0 if asyncio.run(analyse(arguments, arguments.backend)) else 1)
