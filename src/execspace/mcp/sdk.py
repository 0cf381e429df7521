"""The one place that knows which major of the official ``mcp`` SDK is installed, chosen once at import.

``mcp`` 1.x (``mcp>=1.30,<2``) serves the 2025 revisions (sessions, ``initialize``); ``mcp`` 2.x (``mcp>=2.3,<3``)
serves the stateless 2026-07-28 revision beside them, and the Tasks extension. Each major has a module of its
own (:mod:`.sdk1`, :mod:`.sdk2`) that binds an :class:`~.calls.App` to that SDK's low-level server through its
public API; nothing else in execspace imports the SDK's server side.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol

from ..errors import SetupFailed
from .calls import App

__all__ = ["SDK_MAJOR", "Bound", "HttpManager", "bind"]

Asgi = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]
_SUPPORTED = {1: "mcp>=1.30,<2", 2: "mcp>=2.3,<3"}


class HttpManager(Protocol):
    """The SDK's streamable HTTP session manager: an ASGI endpoint that runs while :meth:`run` is entered."""

    async def handle_request(
        self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None: ...

    def run(self) -> AbstractAsyncContextManager[None]: ...


class Bound(Protocol):
    """An :class:`~.calls.App` on the installed SDK's server, ready for a transport."""

    async def serve_stdio(self) -> None: ...

    def http_manager(self, *, loopback: bool, max_body: int) -> HttpManager:
        """Streamable HTTP; ``loopback``: Host and Origin must name a loopback address (DNS rebinding)."""
        ...


def _major() -> int:
    try:
        installed = version("mcp")
    except PackageNotFoundError:
        installed = "none"
    major = int(installed.split(".")[0]) if installed[:1].isdigit() else 0
    if major not in _SUPPORTED:
        raise SetupFailed(
            "mcp",
            f"it runs on the official mcp SDK ({' or '.join(_SUPPORTED.values())}), and mcp {installed} is installed",
            "pip install 'execspace[mcp]'",
            component="execspace mcp",
        )
    return major


SDK_MAJOR = _major()
_binding = importlib.import_module(f"{__package__}.sdk{SDK_MAJOR}")


def bind(app: App) -> Bound:
    """``app`` served by the installed SDK."""
    bound: Bound = _binding.Binding(app)
    return bound
