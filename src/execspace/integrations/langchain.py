"""LangChain: execspace's tools as LangChain tools, for any LangChain or LangGraph agent.

::

    async with execspace.open_engine("sandbox") as engine:
        async with WorkspaceExecTool(engine, workspace_id="chat-1", policy=CommandPolicy()) as exec_tool:
            tools = langchain_tools(exec_tool.tools())
            result = await tools[0].ainvoke({"command": "ls"})

Each tool keeps its own schema (the JSON schema the execspace tool states), checks its own arguments and answers
with its JSON text; a mistake comes back as an error result, never as an exception. The tools are asynchronous,
as the Engine is: call them with ``ainvoke`` (an agent with ``ainvoke``/``astream``). For deepagents, the sandbox
backend (:mod:`execspace.integrations.deepagents`) gives its ``execute`` and file tools instead.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..tools import Tool
from . import MissingExtra

try:
    from langchain_core.tools import StructuredTool
except ImportError as exc:  # pragma: no cover - the extra is installed where the tests run
    raise MissingExtra("langchain", "LangChain (langchain-core)", exc) from exc

__all__ = ["langchain_tools"]


def langchain_tools(tools: Sequence[Tool]) -> list[StructuredTool]:
    """The tools as LangChain ``StructuredTool``s (asynchronous), e.g. ``langchain_tools(exec_tool.tools())``."""
    return [_structured(tool) for tool in tools]


def _structured(tool: Tool) -> StructuredTool:
    async def run(**arguments: Any) -> str:
        return json.dumps(await tool.call(arguments))

    spec = tool.spec
    return StructuredTool.from_function(
        coroutine=run, name=spec.name, description=spec.description, args_schema=spec.json_schema()
    )
