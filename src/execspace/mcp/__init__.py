"""``execspace mcp``: the tools served over the Model Context Protocol (stdio or streamable HTTP).

Needs the ``mcp`` extra (the official ``mcp`` SDK); see docs/integrations.md.
"""

from .app import McpApp
from .calls import Caller
from .config import McpConfig, PolicyConfig, load_config
from .sdk import SDK_MAJOR
from .server import MCP_PATH, BearerAuth, generate_token, serve
from .tasks import Tasks
from .toolset import McpTools
from .workspaces import WORKSPACE_ID_PATTERN, Workspaces

__all__ = [
    "MCP_PATH",
    "SDK_MAJOR",
    "WORKSPACE_ID_PATTERN",
    "BearerAuth",
    "Caller",
    "McpApp",
    "McpConfig",
    "McpTools",
    "PolicyConfig",
    "Tasks",
    "Workspaces",
    "generate_token",
    "load_config",
    "serve",
]
