"""A scripted chat model behind a real local HTTP server speaking OpenAI's chat-completions wire format.

For tests and examples that must run without a network or a provider's key: each POST to
``/v1/chat/completions`` answers with the next scripted reply, and every request body is kept so a test can
check what the model was sent (the tools offered, the tool results)::

    with ScriptedChatServer([tool_call("run_code", {"language": "python", "code": "print(6*7)"}),
                             lambda request: text(last_tool_result(request))]) as server:
        model = ChatCompletions(server.base_url, model="scripted")
        ...
        assert server.requests[1]["messages"][-1]["role"] == "tool"

A reply is a message dict (``text(...)``, ``tool_call(...)``) or a function of the request giving one. Once the
script is used up, the server answers 500 saying so.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = ["ScriptedChatServer", "ScriptedReply", "last_tool_result", "text", "tool_call"]

Message = dict[str, Any]
ScriptedReply = Message | Callable[[Mapping[str, Any]], Message]

_PATH = "/v1/chat/completions"


def text(content: str) -> Message:
    """An assistant message that ends the turn."""
    return {"role": "assistant", "content": content}


def tool_call(
    name: str, arguments: Mapping[str, Any], *, call_id: str | None = None, content: str | None = None
) -> Message:
    """An assistant message calling one tool (``arguments`` as the JSON text the wire format carries)."""
    return tool_calls([(name, arguments)], ids=[call_id] if call_id else None, content=content)


def tool_calls(
    calls: Sequence[tuple[str, Mapping[str, Any]]], *, ids: Sequence[str] | None = None, content: str | None = None
) -> Message:
    """An assistant message calling several tools at once."""
    made = [
        {
            "id": (ids[i] if ids else f"call_{i}_{name}"),
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(dict(args))},
        }
        for i, (name, args) in enumerate(calls)
    ]
    return {"role": "assistant", "content": content, "tool_calls": made}


def last_tool_result(request: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON of the newest tool message of a request (what the model was told the tool returned)."""
    for message in reversed(request["messages"]):
        if message.get("role") == "tool":
            found: dict[str, Any] = json.loads(message["content"])
            return found
    raise AssertionError("the request holds no tool message")


class ScriptedChatServer:
    """The scripted model on ``127.0.0.1`` (a free port), served from a thread while the ``with`` block runs."""

    def __init__(self, replies: Sequence[ScriptedReply]) -> None:
        self._replies = list(replies)
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        """Every request body received, in order."""
        self.headers: list[dict[str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted-chat", daemon=True)

    @property
    def base_url(self) -> str:
        """What an OpenAI-compatible client takes as its base URL (``.../v1``)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def __enter__(self) -> ScriptedChatServer:
        self._thread.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _next(self, request: dict[str, Any], headers: dict[str, str]) -> Message | None:
        with self._lock:
            self.requests.append(request)
            self.headers.append(headers)
            if not self._replies:
                return None
            reply = self._replies.pop(0)
        return reply(request) if callable(reply) else reply

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path != _PATH:
                    return self._send(404, {"error": {"message": f"only {_PATH} is served"}})
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                message = owner._next(body, {k.lower(): v for k, v in self.headers.items()})
                if message is None:
                    return self._send(500, {"error": {"message": "the scripted model has no more replies"}})
                return self._send(200, _completion(body, message))

            def _send(self, status: int, payload: Mapping[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # tests read results, not access logs
                pass

        return Handler


def _completion(request: Mapping[str, Any], message: Message) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-scripted-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model", "scripted"),
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }
