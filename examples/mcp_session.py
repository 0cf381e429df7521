"""An MCP client session against ``execspace mcp``, with the official MCP SDK's client.

    python examples/mcp_session.py                    # spawns `python -m execspace mcp` over stdio
    python examples/mcp_session.py --backend jupyter  # a stateful kernel: a matplotlib plot comes back as a PNG

The same calls an MCP host (Claude Desktop, an IDE) makes for its model: list the tools, make a workspace, put a
file in, run code on it, read the result back, and keep the workspace by its id.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

CSV = "city,temp\nOslo,4\nLisbon,19\nCairo,28\n"
PLAIN = (
    "import csv\nrows = list(csv.DictReader(open('inputs/weather.csv')))\n"
    "hot = max(rows, key=lambda r: int(r['temp']))\nprint('warmest:', hot['city'], hot['temp'])\n"
    "open('../out/summary.txt', 'w').write(f\"{len(rows)} cities, warmest {hot['city']}\\n\")\n"
)
PLOT = (
    "import csv, matplotlib.pyplot as plt\nrows = list(csv.DictReader(open('inputs/weather.csv')))\n"
    "plt.bar([r['city'] for r in rows], [int(r['temp']) for r in rows])\nplt.show()\n"
)


def data(result: types.CallToolResult) -> dict[str, Any]:
    first = result.content[0]
    assert isinstance(first, types.TextContent)
    found: dict[str, Any] = json.loads(first.text)
    return found


async def main(args: argparse.Namespace) -> int:
    server = StdioServerParameters(command=sys.executable, args=["-m", "execspace", "mcp", "--backend", args.backend])
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        names = [t.name for t in (await session.list_tools()).tools]
        print("tools:", ", ".join(names))
        ws = data(await session.call_tool("workspace_create", {"workspace_id": "examples/weather"}))["workspace_id"]
        await session.call_tool("write_file", {"workspace_id": ws, "path": "inputs/weather.csv", "content": CSV})
        code = PLOT if args.backend == "jupyter" else PLAIN
        ran = await session.call_tool("run_code", {"workspace_id": ws, "language": "python", "code": code})
        print("run_code:", data(ran)["status"], data(ran)["output"].strip())
        for block in ran.content:
            if isinstance(block, types.ImageContent):
                target = args.out_dir / "plot.png"
                target.write_bytes(base64.b64decode(block.data))
                print(f"image: {target} ({block.mimeType})")
            elif isinstance(block, types.EmbeddedResource) and isinstance(block.resource, types.TextResourceContents):
                print(f"resource: {block.resource.uri}: {block.resource.text.strip()}")
        listed = data(await session.call_tool("list_files", {"workspace_id": ws, "patterns": ["out/**"]}))
        print("out/:", [e["path"] for e in listed["entries"]])
        await session.call_tool("workspace_close", {"workspace_id": ws})
    return 0 if data(ran)["status"] == "ok" else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="sandbox")
    parser.add_argument("--out-dir", type=Path, default=Path("."))
    sys.exit(asyncio.run(main(parser.parse_args())))
