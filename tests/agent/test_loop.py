"""The agent loop against a scripted model behind a real local HTTP server (the chat-completions wire format),
with real tools on the sandbox backend."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import execspace
from execspace import BaseEngine

pytest.importorskip("httpx", reason="needs the agent extra (pip install 'execspace[agent]')")

from execspace.agent import Agent, AgentEvent, ChatCompletions, ModelError, workspace_tools
from execspace.executor import CodeExecutor
from execspace.testing.binding import make_traversable
from execspace.testing.chatmodel import ScriptedChatServer, last_tool_result, text, tool_call, tool_calls
from execspace.tools import FencedCodeProcessor

WS = "agent/test/s1"


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[BaseEngine]:
    root = tmp_path / "ws"
    root.mkdir()
    make_traversable(root)
    async with execspace.open_engine("sandbox", workspace_root=root) as eng:
        yield eng


async def collect(agent: Agent, prompt: str) -> list[AgentEvent]:
    return [event async for event in agent.stream(prompt)]


async def test_tool_calls_run_and_their_results_go_back_to_the_model(engine: BaseEngine) -> None:
    script = [
        tool_call("workspace_exec", {"command": "python3 -c 'print(6*7)'"}, content="Computing."),
        lambda request: text(f"The answer is {last_tool_result(request)['stdout'].strip()}."),
    ]
    with ScriptedChatServer(script) as server:
        async with (
            workspace_tools(engine, WS) as tools,
            ChatCompletions(server.base_url, model="scripted", api_key="sk-test") as model,
        ):
            agent = Agent(model, tools, system="You compute.")
            events = await collect(agent, "What is 6*7?")
    assert [e.kind for e in events] == ["assistant", "tool_call", "tool_result", "final"]
    assert events[2].result is not None and events[2].result["exit_code"] == 0
    assert events[-1].text == "The answer is 42."
    first, second = server.requests
    assert first["model"] == "scripted"
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert {t["function"]["name"] for t in first["tools"]} >= {"workspace_exec", "execute_code", "workspace_poll"}
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    assert second["messages"][3]["tool_call_id"] == second["messages"][2]["tool_calls"][0]["id"]
    assert server.headers[0]["authorization"] == "Bearer sk-test"
    assert agent.transcript[-1] == {"role": "assistant", "content": "The answer is 42."}


async def test_files_persist_across_turns_in_the_same_workspace(engine: BaseEngine) -> None:
    script = [
        tool_call("execute_code", {"language": "python", "code": "open('notes.txt', 'w').write('first turn')"}),
        text("Saved."),
        tool_call("workspace_exec", {"command": "cat notes.txt"}),
        lambda request: text(last_tool_result(request)["stdout"]),
    ]
    with ScriptedChatServer(script) as server:
        async with workspace_tools(engine, WS) as tools, ChatCompletions(server.base_url, model="m") as model:
            agent = Agent(model, tools)
            assert await agent.run("Save a note.") == "Saved."
            assert await agent.run("Read it back.") == "first turn"
    assert len(server.requests[3]["messages"]) == 7  # both turns, in one transcript


async def test_several_calls_in_one_reply_run_in_order_and_mistakes_reach_the_model(engine: BaseEngine) -> None:
    script = [
        tool_calls(
            [
                ("no_such_tool", {}),
                ("workspace_exec", {"command": ""}),
                ("workspace_exec", {"command": "echo ok"}),
            ]
        ),
        text("done"),
    ]
    with ScriptedChatServer(script) as server:
        async with workspace_tools(engine, WS) as tools, ChatCompletions(server.base_url, model="m") as model:
            events = await collect(Agent(model, tools), "go")
    results = [e.result for e in events if e.kind == "tool_result"]
    assert results[0] is not None and "no tool named 'no_such_tool'" in results[0]["error"]
    assert results[1] is not None and results[1]["status"] == "error"
    assert results[2] is not None and results[2]["stdout"] == "ok\n"
    sent = [json.loads(m["content"]) for m in server.requests[1]["messages"] if m["role"] == "tool"]
    assert [r.get("status") for r in sent] == ["error", "error", "exited"]


async def test_the_fenced_code_processor_runs_a_code_reply_when_enabled(engine: BaseEngine) -> None:
    script = [text("```python\nprint(sum(range(10)))\n```"), lambda request: text(request["messages"][-1]["content"])]
    with ScriptedChatServer(script) as server:
        async with ChatCompletions(server.base_url, model="m") as model:
            processor = FencedCodeProcessor(CodeExecutor(engine, timeout=30))
            agent = Agent(model, [], processor=processor, execution_id=WS)
            events = await collect(agent, "sum 0..9")
    assert [e.kind for e in events] == ["code_execution_code", "code_execution_result", "final"]
    assert "45" in (events[1].text or "") and "45" in (events[2].text or "")
    assert "tools" not in server.requests[0]  # no tools offered: none sent


async def test_the_step_limit_stops_a_model_that_never_answers(engine: BaseEngine) -> None:
    script = [tool_call("workspace_exec", {"command": "true"}) for _ in range(3)]
    with ScriptedChatServer(script) as server:
        async with workspace_tools(engine, WS) as tools, ChatCompletions(server.base_url, model="m") as model:
            agent = Agent(model, tools, max_steps=2)
            events = await collect(agent, "loop")
            assert events[-1].kind == "stopped" and "max_steps=2" in (events[-1].text or "")
    assert len(server.requests) == 2


async def test_an_endpoint_error_is_a_model_error_naming_the_status() -> None:
    with ScriptedChatServer([]) as server:
        async with ChatCompletions(server.base_url, model="m") as model:
            with pytest.raises(ModelError, match="answered 500: the scripted model has no more replies"):
                await Agent(model, []).run("hi")
        async with ChatCompletions(server.base_url.replace("/v1", "/nope"), model="m") as model:
            with pytest.raises(ModelError, match="answered 404"):
                await Agent(model, []).run("hi")
    async with ChatCompletions(server.base_url, model="m") as model:  # the server is gone
        with pytest.raises(ModelError, match="cannot reach the chat model"):
            await Agent(model, []).run("hi")
