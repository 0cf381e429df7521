"""An OpenAI-compatible chat-completions client over plain httpx: what the agent loop asks for its next step.

Any provider speaking the wire format works (OpenAI, Azure's ``/openai/v1``, OpenRouter, vLLM, Ollama,
llama.cpp's server, LiteLLM): give its base URL (the part before ``/chat/completions``), a model name and a key.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

import httpx

from ..errors import BackendError, InvalidSpec

__all__ = ["ChatCompletions", "ChatModel", "ChatReply", "ModelError", "ToolCall"]


class ModelError(BackendError):
    """The chat model's endpoint failed or answered something that is not a chat completion."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """The JSON text of the arguments, as the model wrote it (it may be invalid: the tool says so)."""


@dataclass(frozen=True, slots=True)
class ChatReply:
    """One assistant message."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    message: Mapping[str, Any] = field(default_factory=dict)
    """The message as received, to put back into the conversation unchanged."""


class ChatModel(Protocol):
    """What the agent loop needs from a model: the next assistant message for a conversation and tools."""

    async def complete(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
    ) -> ChatReply: ...


class ChatCompletions:
    """``POST {base_url}/chat/completions`` with the conversation and the tools' ``ToolSpec.openai()`` entries.

    Args:
        base_url: e.g. ``https://api.openai.com/v1`` or ``http://127.0.0.1:11434/v1``.
        model: the provider's model name.
        api_key: sent as a bearer token; default: the variable named by ``api_key_env`` (none: no header).
        timeout: seconds for one completion.
        options: more request fields (``temperature``, ``max_tokens``…), sent as they are.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 120,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise InvalidSpec(f"base_url must be an http(s) URL, got {base_url!r}")
        if not model:
            raise InvalidSpec("model must name the provider's model")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.options = dict(options or {})
        key = api_key if api_key is not None else os.environ.get(api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.AsyncClient(headers=headers, timeout=timeout)

    async def complete(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> ChatReply:
        body: dict[str, Any] = {**self.options, "model": self.model, "messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
        try:
            answer = await self._client.post(self.url, json=body)
        except httpx.HTTPError as exc:
            raise ModelError(
                f"cannot reach the chat model at {self.url}: {exc}; check base_url and the network"
            ) from exc
        if answer.status_code != 200:
            raise ModelError(
                f"the chat model at {self.url} answered {answer.status_code}: {_error_text(answer)}; check the model "
                "name, the API key and the request limits"
            )
        return _reply(answer, self.url)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> ChatCompletions:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _error_text(answer: httpx.Response) -> str:
    try:
        error = answer.json().get("error")
        if isinstance(error, Mapping) and error.get("message"):
            return str(error["message"])
    except (ValueError, AttributeError):
        pass
    return answer.text[:500] or answer.reason_phrase


def _reply(answer: httpx.Response, url: str) -> ChatReply:
    try:
        message = answer.json()["choices"][0]["message"]
        calls = tuple(
            ToolCall(c["id"], c["function"]["name"], c["function"].get("arguments") or "{}")
            for c in message.get("tool_calls") or ()
        )
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ModelError(f"the answer of {url} is not a chat completion ({exc!r}): {answer.text[:300]}") from None
    content = message.get("content")
    return ChatReply(content if isinstance(content, str) else None, calls, message)


def tool_message(call: ToolCall, result: Mapping[str, Any]) -> dict[str, Any]:
    """The ``tool`` message that answers ``call``."""
    return {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result, ensure_ascii=False)}
