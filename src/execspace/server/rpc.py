"""What every envd Connect service shares: the sandbox of a call, and errors in Connect's terms.

The app looks a request's sandbox up once (and checks the caller's credential for it) before it hands the request
to a Connect service; connectrpc then calls the service's method with a :class:`RequestContext`, which carries the
headers but nothing of the app's. So the app sets the sandbox for the request in a context variable
(:func:`calls_on`): the method, and every task it starts, sees that sandbox object, never a second lookup.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext

from ..errors import LimitExceeded, PathDenied, UsageError
from .paths import USER, check_user
from .routing import user_of
from .sandboxes import Sandbox, Sandboxes, SandboxGone
from .shares import ShareExhausted

__all__ = ["ServiceBase", "calls_on", "rpc_errors"]

#: The sandbox of the request being served (set by the app around the Connect service, see :func:`calls_on`).
_CALL_SANDBOX: ContextVar[Sandbox | None] = ContextVar("execspace_call_sandbox", default=None)


@contextlib.contextmanager
def calls_on(sandbox: Sandbox) -> Iterator[None]:
    """Serve the calls of the block (and of the tasks it starts) on ``sandbox``, found by the app."""
    token = _CALL_SANDBOX.set(sandbox)
    try:
        yield
    finally:
        _CALL_SANDBOX.reset(token)


class ServiceBase:
    def __init__(self, sandboxes: Sandboxes) -> None:
        self.sandboxes = sandboxes

    def sandbox(self, ctx: RequestContext[Any, Any], *, runs: bool = False) -> Sandbox:
        """The call's sandbox, as the app found it and checked the caller's token for it; one that ended since (a
        request may wait its turn in the sandbox's pace) is gone for the call too. Its user must be ``user``, or
        with ``runs`` (a process call) one its engine's runs may name (a machine sandbox's root)."""
        sandbox = _CALL_SANDBOX.get()
        if sandbox is None:
            raise ConnectError(Code.INVALID_ARGUMENT, "no E2b-Sandbox-Id header names the sandbox")
        if sandbox.closed.is_set() or sandbox.expired():
            raise ConnectError(Code.UNAVAILABLE, str(SandboxGone(sandbox.id)))
        with rpc_errors():
            check_user(user_of(ctx.request_headers), (USER, *sandbox.engine.describe().users) if runs else (USER,))
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
    except PermissionError as exc:  # the sandbox's user may not (a path outside the home, through the sandbox)
        raise ConnectError(Code.PERMISSION_DENIED, _text(exc, path)) from None
    except (LimitExceeded, ShareExhausted) as exc:
        raise ConnectError(Code.RESOURCE_EXHAUSTED, _text(exc, path)) from None
    except OSError as exc:
        if exc.errno == errno.EROFS:  # a read-only part of the sandbox's system (outside the home)
            raise ConnectError(Code.PERMISSION_DENIED, _text(exc, path)) from None
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ConnectError(Code.RESOURCE_EXHAUSTED, _text(exc, path)) from None
        raise


def _text(exc: BaseException, path: str | None) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, PathDenied) and exc.strerror:
        return f"{exc.strerror}: {path or exc.filename}"
    return str(exc)
