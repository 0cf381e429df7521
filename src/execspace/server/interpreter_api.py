"""The code interpreter's HTTP routes (port 49999): ``POST /execute`` as an NDJSON stream, and ``/contexts``.

Errors are E2B's: 404 for an unknown context (the SDK's ``NotFoundException``), 400 for a bad body, 501 for a
language without a kernel here, 429 for too many contexts; a kernel that cannot start says why (503).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from ..errors import ExecspaceError, SetupFailed, UsageError
from .bodies import DATA_BODY_BYTES, BadBody, BodyTooLarge, json_object
from .control import error_response
from .events import CellExecuted, Events
from .interpreter import (
    CodeInterpreter,
    Context,
    ContextNotFound,
    LanguageUnavailable,
    TooManyContexts,
    json_line,
)
from .sandboxes import Sandbox, SandboxGone
from .shares import ShareExhausted
from .streams import CountedStream

__all__ = ["InterpreterAPI"]

_log = logging.getLogger("execspace.server")


class InterpreterAPI:
    """Answers one code-interpreter request of a known sandbox."""

    def __init__(self, interpreter: CodeInterpreter, events: Events | None = None) -> None:
        self.interpreter = interpreter
        self._events = events or Events()

    async def respond(self, request: Request, sandbox: Sandbox) -> Response:
        path, method = request.url.path, request.method
        try:
            if path == "/execute" and method == "POST":
                return await self._execute(request, sandbox)
            if path == "/contexts" and method == "POST":
                body = await json_object(request, DATA_BODY_BYTES)
                context = await self.interpreter.create(sandbox, _str(body, "language"), _str(body, "cwd"))
                return JSONResponse(context.describe())
            if path == "/contexts" and method == "GET":
                return JSONResponse([c.describe() for c in self.interpreter.contexts(sandbox)])
            if path.startswith("/contexts/") and path.endswith("/restart") and method == "POST":
                await self.interpreter.restart(sandbox, path.removeprefix("/contexts/").removesuffix("/restart"))
                return Response(status_code=204)
            if path.startswith("/contexts/") and method == "DELETE":
                await self.interpreter.remove(sandbox, path.removeprefix("/contexts/"))
                return Response(status_code=204)
            if path == "/health" and method == "GET":
                return PlainTextResponse("OK")
        except ContextNotFound as exc:
            return PlainTextResponse(str(exc), status_code=404)
        except SandboxGone as exc:
            return error_response(502, str(exc))
        except LanguageUnavailable as exc:
            return error_response(501, str(exc))
        except (TooManyContexts, ShareExhausted) as exc:
            return error_response(429, str(exc))
        except SetupFailed as exc:
            return error_response(503, f"the code interpreter's kernel could not start: {exc}")
        except BodyTooLarge as exc:
            return error_response(413, str(exc))
        except (UsageError, BadBody) as exc:
            return error_response(400, str(exc))
        if path in ("/execute", "/contexts", "/health") or path.startswith("/contexts/"):
            return error_response(501, f"{method} {path} is not implemented by execspace serve")
        return error_response(404, f"{method} {path} is not a code interpreter route")

    async def _execute(self, request: Request, sandbox: Sandbox) -> Response:
        body = await json_object(request, DATA_BODY_BYTES)
        code = body.get("code")
        if not isinstance(code, str):
            raise BadBody("/execute needs a string 'code'")
        context_id, language = _str(body, "context_id"), _str(body, "language")
        if context_id and language:
            raise BadBody("give context_id or language, not both")
        env_vars = body.get("env_vars") or {}
        if not isinstance(env_vars, dict) or not all(isinstance(v, str) for v in env_vars.values()):
            raise BadBody("env_vars must be an object of strings")
        timeout = body.get("timeout")
        if timeout is not None and (not isinstance(timeout, int | float) or timeout < 0):
            raise BadBody("timeout must be a number of seconds")
        interp = self.interpreter
        context = interp.context(sandbox, context_id) if context_id else await interp.default(sandbox, language)
        sandbox.share.streams.take()
        if self._events.listening:
            size = len(code.encode())
            self._events(CellExecuted(sandbox.id, sandbox.owner, context.id, context.language, size))
        try:
            lines = interp.execute(sandbox, context, code, env_vars, timeout or None)
            first = await _first(lines, context)
        except BaseException:
            sandbox.share.streams.give_back()
            raise
        return CountedStream(_ndjson(first, lines), sandbox.share.streams, media_type="application/x-ndjson")


async def _first(lines: AsyncIterator[dict[str, Any]], context: Context) -> dict[str, Any] | None:
    """The first line, so that a kernel that cannot start is an HTTP error rather than a broken stream."""
    try:
        return await anext(lines)
    except StopAsyncIteration:
        return None
    except ExecspaceError:
        raise
    except Exception as exc:
        _log.exception("context %s: the cell could not start", context.id)
        raise SetupFailed("serve", f"context {context.id}: {exc}", "see the server's log") from exc


async def _ndjson(first: dict[str, Any] | None, lines: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    if first is None:
        return
    yield json_line(first)
    async for line in lines:
        yield json_line(line)


def _str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None or isinstance(value, str):
        return value or None
    raise BadBody(f"{key!r} must be a string")
