"""The minimal agent loop: offer the tools to a chat model, run the calls it makes, until it answers in text.

::

    async with execspace.open_engine("sandbox") as engine, workspace_tools(engine, "app/user/s1") as tools, \\
            ChatCompletions("https://api.openai.com/v1", model="gpt-4.1-mini") as model:
        agent = Agent(model, tools, system="You analyse data.")
        async for event in agent.stream("Plot work/inputs/sales.csv to out/chart.svg"):
            print(event.kind, event.text or event.name or "")
        agent.transcript                                      # every message, in the wire format

Each step sends the whole transcript; the model's tool calls run one after another (in the order it gave them)
and their JSON results go back as ``tool`` messages. A reply without calls ends the turn, unless the fenced-code
processor is given and the reply is exactly one code block: then the block runs, its result goes back as a user
message, and the loop goes on. ``max_steps`` bounds the model calls of one turn.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import InvalidSpec, UsageError
from ..executor import CodeExecutor
from ..protocols import Engine
from ..tools import ExecuteCodeTool, FencedCodeProcessor, Tool, WorkspaceExecTool, error_result
from .chat import ChatModel, ChatReply, ToolCall, tool_message

__all__ = ["Agent", "AgentEvent", "workspace_tools"]

EventKind = Literal[
    "assistant", "tool_call", "tool_result", "code_execution_code", "code_execution_result", "final", "stopped"
]


@dataclass(frozen=True, slots=True)
class AgentEvent:
    """One thing that happened in a turn, as it happens."""

    kind: EventKind
    text: str | None = None
    """assistant/final: the model's text; code events: the code or its result; stopped: why."""
    name: str | None = None
    """tool_call/tool_result: the tool."""
    arguments: str | None = None
    """tool_call: the arguments' JSON text."""
    result: Mapping[str, Any] | None = None
    """tool_result: what the tool returned (and the model was sent)."""
    call_id: str | None = None


@dataclass(slots=True)
class Agent:
    """A conversation with ``model`` over ``tools``; ``transcript`` holds it in the chat-completions format."""

    model: ChatModel
    tools: Sequence[Tool]
    system: str | None = None
    max_steps: int = 16
    processor: FencedCodeProcessor | None = None
    """Run a reply that is exactly one fenced code block (opt-in; tool calls are the main path)."""
    execution_id: str | None = None
    """The workspace the processor runs code in."""
    transcript: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise InvalidSpec(f"max_steps must be at least 1, got {self.max_steps}")
        names = [t.spec.name for t in self.tools]
        if len(set(names)) != len(names):
            raise InvalidSpec(f"tool names must be unique, got {names}")
        if self.system and not self.transcript:
            self.transcript.append({"role": "system", "content": self.system})

    async def run(self, prompt: str) -> str:
        """One turn: the model's final text (``UsageError`` if it ran out of steps first)."""
        final: str | None = None
        async for event in self.stream(prompt):
            if event.kind == "final":
                final = event.text or ""
            elif event.kind == "stopped":
                raise UsageError(f"the agent stopped: {event.text}")
        assert final is not None
        return final

    async def stream(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """One turn, as events; ends with ``final`` or ``stopped``."""
        self.transcript.append({"role": "user", "content": prompt})
        specs = [t.spec.openai() for t in self.tools]
        for _ in range(self.max_steps):
            reply = await self.model.complete(self.transcript, specs)
            self.transcript.append(_assistant(reply))
            if reply.content and reply.tool_calls:
                yield AgentEvent("assistant", text=reply.content)
            if reply.tool_calls:
                for call in reply.tool_calls:
                    async for event in self._call(call):
                        yield event
                continue
            ran = False
            async for event in self._process(reply.content or ""):
                ran = True
                yield event
            if not ran:
                yield AgentEvent("final", text=reply.content or "")
                return
        yield AgentEvent("stopped", text=f"no final answer within max_steps={self.max_steps} model calls")

    async def _call(self, call: ToolCall) -> AsyncIterator[AgentEvent]:
        yield AgentEvent("tool_call", name=call.name, arguments=call.arguments, call_id=call.id)
        tool = next((t for t in self.tools if t.spec.name == call.name), None)
        if tool is None:
            known = ", ".join(t.spec.name for t in self.tools)
            result = error_result(UsageError(f"no tool named {call.name!r}; the tools are: {known}"))
        else:
            result = await tool.call(call.arguments)
        self.transcript.append(tool_message(call, result))
        yield AgentEvent("tool_result", name=call.name, result=result, call_id=call.id)

    async def _process(self, reply: str) -> AsyncIterator[AgentEvent]:
        if self.processor is None or not reply:
            return
        outcome = await self.processor.process(reply, execution_id=self.execution_id)
        if outcome is None:
            return
        yield AgentEvent(outcome.code_event.kind, text=outcome.code_event.content)
        self.transcript.append({"role": "user", "content": outcome.result_event.content})
        yield AgentEvent(outcome.result_event.kind, text=outcome.result_event.content)


def _assistant(reply: ChatReply) -> dict[str, Any]:
    if reply.message:
        return dict(reply.message)
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls
        ]
    return message


@contextlib.asynccontextmanager
async def workspace_tools(
    engine: Engine, workspace_id: str, *, run_timeout: float = 300, languages: Sequence[str] | None = None
) -> AsyncIterator[list[Tool]]:
    """``workspace_exec`` (with its poll/write_stdin/kill) and ``execute_code``, both in workspace
    ``workspace_id``, each run killed after ``run_timeout`` seconds; background sessions are killed when the
    block ends."""
    executor = CodeExecutor(engine, timeout=run_timeout)
    code = ExecuteCodeTool(executor, languages=languages, execution_id=workspace_id)
    async with WorkspaceExecTool(engine, workspace_id=workspace_id, default_timeout=run_timeout) as shell:
        yield [*shell.tools(), code]
