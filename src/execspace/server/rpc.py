"""What every envd Connect service shares: finding the sandbox of a call, and errors in Connect's terms."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext

from ..errors import LimitExceeded, PathDenied, UsageError
from .paths import check_user
from .routing import target_of, user_of
from .sandboxes import Sandbox, Sandboxes, SandboxGone
from .shares import ShareExhausted

__all__ = ["ServiceBase", "rpc_errors"]


class ServiceBase:
    def __init__(self, sandboxes: Sandboxes) -> None:
        self.sandboxes = sandboxes

    def sandbox(self, ctx: RequestContext[Any, Any]) -> Sandbox:
        """The call's sandbox (the router checked it exists and the token; it may have ended since)."""
        headers = ctx.request_headers
        target = target_of(headers, self.sandboxes.options.domain)
        if target is None:
            raise ConnectError(Code.INVALID_ARGUMENT, "no E2b-Sandbox-Id header names the sandbox")
        try:
            sandbox = self.sandboxes.get(target.sandbox_id)
        except SandboxGone as exc:
            raise ConnectError(Code.UNAVAILABLE, str(exc)) from None
        with rpc_errors():
            check_user(user_of(headers))
        return sandbox


@contextlib.contextmanager
def rpc_errors(path: str | None = None) -> Iterator[None]:
    """Answer the Engine's errors with the Connect codes the SDK branches on; ``path`` is the SDK's path, which
    messages name instead of the workspace path."""
    try:
        yield
    except FileNotFoundError as exc:
        raise ConnectError(Code.NOT_FOUND, _text(exc, path)) from None
    except FileExistsError as exc:
        raise ConnectError(Code.ALREADY_EXISTS, _text(exc, path)) from None
    except (NotADirectoryError, IsADirectoryError, UsageError) as exc:
        raise ConnectError(Code.INVALID_ARGUMENT, _text(exc, path)) from None
    except PathDenied as exc:
        raise ConnectError(Code.PERMISSION_DENIED, _text(exc, path)) from None
    except (LimitExceeded, ShareExhausted) as exc:
        raise ConnectError(Code.RESOURCE_EXHAUSTED, _text(exc, path)) from None


def _text(exc: BaseException, path: str | None) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, PathDenied) and exc.strerror:
        return f"{exc.strerror}: {path or exc.filename}"
    return str(exc)
