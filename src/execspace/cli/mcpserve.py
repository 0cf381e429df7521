"""``execspace mcp``: the tools as an MCP server, over stdio or streamable HTTP (see docs/integrations.md)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import SetupFailed
from ..registry import choose_default_backend

__all__ = ["TOKEN_VARIABLE", "add_parser", "command"]

#: The environment variable a bearer token may come from instead of ``--token``.
TOKEN_VARIABLE = "EXECSPACE_MCP_TOKEN"  # noqa: S105 - a variable name, not a secret


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "mcp",
        help="serve workspaces to MCP clients (commands, code, files, skills) over stdio or streamable HTTP",
        description=(
            "An MCP server whose tools run commands and code in workspaces of a backend (default: the safest "
            "that works here). Over HTTP a bearer token is required. Needs the 'mcp' extra."
        ),
    )
    p.add_argument("--backend", help="backend the workspaces live on (default: the config's, else the safest)")
    p.add_argument("--transport", choices=("stdio", "http"), default="stdio", help="default stdio")
    p.add_argument("--host", default="127.0.0.1", help="http: address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="http: port to listen on; 0 picks a free one (default 8000)")
    p.add_argument(
        "--token",
        help=f"http: the bearer token clients must send (default: ${TOKEN_VARIABLE}, else a random one printed to "
        "stderr; a flag is visible to other users in ps, the variable is not)",
    )
    p.add_argument("--config", metavar="FILE", help="a TOML file: backend, its options, policy, limits, roots")
    p.add_argument(
        "--metrics",
        choices=("open", "key", "off"),
        default="open",
        help="http: who may read GET /metrics (Prometheus text): open, anyone who reaches the port (default); key, "
        "a holder of the bearer token; off, nobody (404)",
    )
    p.add_argument(
        "--audit-log",
        type=Path,
        metavar="FILE",
        help="append one JSON line per tool call to FILE (0600; created if missing): commands, code, file writes "
        "and removes, workspaces, refusals; SIGHUP reopens it (rotation)",
    )
    p.add_argument(
        "--environment",
        metavar="NAME",
        help="run commands and code in the built runtime environment NAME (execspace env build code-interpreter: "
        "python with pandas, matplotlib…); implies --backend sandbox unless the backend is jupyter or container",
    )
    p.set_defaults(handler=command)


async def command(args: argparse.Namespace) -> int:
    try:
        from ..mcp import generate_token, load_config, serve
    except ImportError as exc:
        raise SetupFailed(
            "mcp",
            f"the MCP server's dependencies are missing ({exc.name})",
            "pip install 'execspace[mcp]'",
            component="execspace mcp",
        ) from None
    config = load_config(args.config).with_flags(backend=args.backend, environment=args.environment)
    if config.backend in (None, "auto"):
        # chosen here, so that what the ready line names is the backend the server opens
        config = config.with_flags(backend=await choose_default_backend(dict(config.backend_options)))
    given = args.token or os.environ.get(TOKEN_VARIABLE)
    token = given or generate_token()

    def ready(host: str, port: int) -> None:
        lines = [f"execspace mcp: streamable HTTP on http://{host}:{port}/mcp (backend {config.backend})"]
        if not given:
            lines.append(f"  bearer token: {token}")
        print("\n".join(lines), file=sys.stderr, flush=True)

    await serve(
        config,
        transport=args.transport,
        host=args.host,
        port=args.port,
        token=token,
        on_ready=ready,
        metrics=args.metrics,
        audit_log=None if args.audit_log is None else args.audit_log.resolve(),
    )
    return 0
