"""Running the server: open the Engine, serve the app with uvicorn, and remove every sandbox on the way out."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvicorn

from ..backends.sandbox import SessionConfig
from ..engine import open_engine
from .app import E2BApp
from .interpreter import CodeInterpreter
from .options import ServerOptions
from .paths import HOME, HOME_DIR
from .sandboxes import Sandboxes

__all__ = ["serve"]

#: Seconds an idle client connection is kept open.
_KEEP_ALIVE = 30


async def serve(
    options: ServerOptions,
    *,
    host: str = "127.0.0.1",
    port: int = 3000,
    backend: str | None = "sandbox",
    backend_options: dict[str, Any] | None = None,
    on_ready: Callable[[str, int], None] | None = None,
) -> None:
    """Serve until cancelled or signalled (SIGINT/SIGTERM); on the way out every sandbox is killed and removed.

    ``on_ready(host, port)`` runs once the socket listens (``port=0`` picks a free one; this is how to learn it).
    """
    opts = dict(backend_options or {})
    if backend == "sandbox":
        # E2B's programs name their files by its home: there it is the directory SDK paths map to
        opts.setdefault("program_links", ((HOME, HOME_DIR),))
        if opts.get("mode") == "session":
            # a sandbox's session lives as long as the sandbox (whose timeout the reaper enforces): an idle
            # sandbox, a pooled one included, does not lose it and pay its start on the next command
            opts.setdefault("session", SessionConfig(idle_timeout=None))
    async with open_engine(backend, **opts) as engine:
        sandboxes = Sandboxes(engine, options)
        root = getattr(engine.manager, "root", None)  # kernels run on the same workspaces
        interpreter = CodeInterpreter(engine.name, Path(root) if root is not None else None, options.kernel_environment)
        sandboxes.on_remove.append(interpreter.end)
        config = uvicorn.Config(
            E2BApp(sandboxes, interpreter),
            host=host,
            port=port,
            lifespan="off",
            log_level="warning",
            access_log=False,
            # longer than the clients' own (httpx: 5 s), so that a client never sends on a connection the server
            # is closing at the same moment (the request would fail with a read error)
            timeout_keep_alive=_KEEP_ALIVE,
            http="auto",  # httptools (the serve extra has it), else h11: see docs/benchmarks.md for what it saves
        )
        reaper = asyncio.create_task(sandboxes.reap())
        sandboxes.pool.fill()
        try:
            await _Server(config, on_ready, sandboxes.close).serve()
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await sandboxes.close()
            await interpreter.aclose()


class _Server(uvicorn.Server):
    """uvicorn's server, telling where it listens once it does, and ending every sandbox (so their open streams)
    before it waits for the connections to close."""

    def __init__(
        self,
        config: uvicorn.Config,
        on_ready: Callable[[str, int], None] | None,
        before_shutdown: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(config)
        self._on_ready = on_ready
        self._before_shutdown = before_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._before_shutdown()
        await super().shutdown(sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self._on_ready is not None:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            self._on_ready(host, port)
