"""Running the server: open the Engine, serve the app with uvicorn, and remove every sandbox on the way out."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvicorn

from ..engine import open_engine
from .app import E2BApp
from .interpreter import CodeInterpreter
from .options import ServerOptions
from .paths import HOME, HOME_DIR
from .sandboxes import Sandboxes

__all__ = ["LOGIN_PROFILE", "serve", "serve_sandbox_files"]

#: The ``/etc/profile`` of serve's sandboxes, which every command's ``bash -l`` reads (E2B's envd starts each one so):
#: what Debian's sets for a user who is not root (a sandbox's never is), without the ``$(id -u)`` that forks and
#: execs ``id`` in every login shell (about half of a ``commands.run('true')`` here). The host's
#: ``/etc/profile.d`` scripts still run; ``~/.profile`` and the rest are the shell's own, read from ``HOME``.
LOGIN_PROFILE = """\
# /etc/profile of execspace serve's sandboxes (see docs/server.md): Debian's, for a user who is not root.
PATH="/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"
export PATH
if [ "${PS1-}" ]; then
  if [ "${BASH-}" ] && [ "$BASH" != "/bin/sh" ]; then
    if [ -f /etc/bash.bashrc ]; then
      . /etc/bash.bashrc
    fi
  else
    PS1='$ '
  fi
fi
if [ -d /etc/profile.d ]; then
  for i in /etc/profile.d/*.sh; do
    if [ -r "$i" ]; then
      . "$i"
    fi
  done
  unset i
fi
"""


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
        _sandbox_template(opts)
    async with open_engine(backend, **opts) as engine:
        sandboxes = Sandboxes(engine, options)
        root = getattr(engine.manager, "root", None)  # kernels run on the same workspaces
        interpreter = CodeInterpreter(engine.name, Path(root) if root is not None else None, options.kernel_environment)
        sandboxes.on_remove.append(interpreter.end)
        config = uvicorn.Config(
            E2BApp(sandboxes, interpreter), host=host, port=port, lifespan="off", log_level="warning", access_log=False
        )
        reaper = asyncio.create_task(sandboxes.reap())
        try:
            await _Server(config, on_ready, sandboxes.close).serve()
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await sandboxes.close()
            await interpreter.aclose()


def serve_sandbox_files() -> tuple[tuple[str, str], ...]:
    """The sandbox backend's ``system_files`` of serve's sandboxes: their login profile (none on a system without
    ``/etc/profile``, whose login shells read none here either)."""
    return (("/etc/profile", LOGIN_PROFILE),) if os.path.isfile("/etc/profile") else ()


def _sandbox_template(opts: dict[str, Any]) -> None:
    """What the sandbox backend's sandboxes show of E2B's template: its home, and its login profile."""
    # E2B's programs name their files by its home: there it is the directory SDK paths map to
    opts.setdefault("program_links", ((HOME, HOME_DIR),))
    opts.setdefault("system_files", serve_sandbox_files())


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
