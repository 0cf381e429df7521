"""Agent frameworks' own E2B clients, unchanged, against a real ``execspace serve`` (issue 17): smolagents'
E2BExecutor under a CodeAgent, and the OpenAI Agents SDK's E2B sandbox client."""

from __future__ import annotations

import io
from typing import Any

import pytest

smolagents = pytest.importorskip("smolagents", reason="pip install 'execspace[dev]' (smolagents)")
pytest.importorskip("agents.extensions.sandbox.e2b", reason="pip install 'execspace[dev]' (openai-agents)")

from agents.extensions.sandbox.e2b.sandbox import E2BSandboxClient, E2BSandboxClientOptions  # noqa: E402
from agents.sandbox import Manifest  # noqa: E402
from smolagents.models import ChatMessage, MessageRole, Model  # noqa: E402
from smolagents.monitoring import LogLevel  # noqa: E402


class ScriptedModel(Model):  # type: ignore[misc]
    def __init__(self, *replies: str) -> None:
        super().__init__(model_id="scripted")
        self.replies = list(replies)
        self.seen: list[Any] = []

    def generate(self, messages: list[Any], **kwargs: Any) -> ChatMessage:
        self.seen.append(messages)
        return ChatMessage(role=MessageRole.ASSISTANT, content=self.replies.pop(0))


def test_smolagents_e2b_executor_runs_unchanged() -> None:
    model = ScriptedModel(
        "Thought: compute.\n<code>\nvalue = 6 * 7\nprint('value is', value)\n</code>",
        "Thought: answer.\n<code>\nfinal_answer(value)\n</code>",
    )
    agent = smolagents.CodeAgent(tools=[], model=model, executor_type="e2b", verbosity_level=LogLevel.OFF)
    try:
        assert agent.run("What is 6 times 7?") == 42  # the final answer travels as smolagents' own exception
    finally:
        agent.cleanup()  # kills the sandbox
    assert "value is 42" in str(model.seen[1])  # the first action's output came back as its observation


async def test_the_agents_sdk_e2b_client_runs_unchanged() -> None:
    """Its set-up commands run in cwd='/' and name /home/user (both are there in serve's sandboxes); it asks for
    auto-pause unless on_timeout='kill', auto_resume=False (kill at timeout, as the other tests expect). It asks for
    the network by default: a server that keeps sandboxes offline refuses that, naming its flag, never silently."""
    client = E2BSandboxClient()
    asks_network = E2BSandboxClientOptions(sandbox_type="e2b", on_timeout="kill", auto_resume=False)
    with pytest.raises(Exception, match="--allow-internet-access"):
        await client.create(manifest=Manifest(root="/home/user/work"), options=asks_network)
    options = E2BSandboxClientOptions(
        sandbox_type="e2b", on_timeout="kill", auto_resume=False, allow_internet_access=False
    )
    session = await client.create(manifest=Manifest(root="/home/user/work"), options=options)
    try:
        async with session:
            assert (await session.exec("echo hi")).stdout == b"hi\n"
            await session.write("/home/user/work/note.txt", io.BytesIO(b"from the sdk"))
            assert (await session.exec("cat note.txt")).stdout == b"from the sdk"
    finally:
        await client.delete(session)
