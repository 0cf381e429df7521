"""``execspace mcp``: the tools served over the Model Context Protocol (stdio or streamable HTTP).

Needs the ``mcp`` extra (the official ``mcp`` SDK); see docs/integrations.md.
"""

from .config import McpConfig, PolicyConfig, load_config
from .server import MCP_PATH, BearerAuth, build_server, generate_token, serve
from .toolset import McpTools
from .workspaces import WORKSPACE_ID_PATTERN, Workspaces

__all__ = [
    "MCP_PATH",
    "WORKSPACE_ID_PATTERN",
    "BearerAuth",
    "McpConfig",
    "McpTools",
    "PolicyConfig",
    "Workspaces",
    "build_server",
    "generate_token",
    "load_config",
    "serve",
]
