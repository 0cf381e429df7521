"""A minimal agent loop for people without a framework: the tools offered to any OpenAI-compatible chat model.

Needs the ``agent`` extra (httpx); see docs/integrations.md.
"""

from .chat import ChatCompletions, ChatModel, ChatReply, ModelError, ToolCall
from .loop import Agent, AgentEvent, workspace_tools

__all__ = [
    "Agent",
    "AgentEvent",
    "ChatCompletions",
    "ChatModel",
    "ChatReply",
    "ModelError",
    "ToolCall",
    "workspace_tools",
]
