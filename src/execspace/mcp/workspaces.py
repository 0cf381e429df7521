"""The workspaces an MCP server serves: found by an explicit handle, or the default one of an MCP session.

Clients such as claude.ai re-initialise and drop ``Mcp-Session-Id`` between calls, so a session's state must also
be reachable by the id every result names: any tool call may give ``workspace_id``. Without one the call goes to
its session's default workspace, created on first use. A request of the stateless 2026-07-28 revision has no
session: it must give the handle ``workspace_create`` minted (or named), and an unknown one is an error, never a
new empty workspace in its place. A workspace left idle past the limit (no tool call and no
program running in it) is removed with everything in it, as is every workspace when the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import ExecspaceError, InvalidSpec, LimitExceeded, WorkspaceNotFound
from ..models import Workspace
from ..protocols import Engine

__all__ = ["WORKSPACE_ID_PATTERN", "Workspaces"]

_log = logging.getLogger(__name__)

#: What an explicit workspace id may look like (it also names the workspace's artifact scope: app/user/session).
WORKSPACE_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}(/[A-Za-z0-9][A-Za-z0-9._-]{0,63}){0,2}$")


@dataclass(slots=True)
class _Entry:
    ws: Workspace
    last_used: float
    calls: int = 0
    """Tool calls in progress in it (a foreground command may outlast the idle limit)."""


class Workspaces:
    """The server's workspaces on one engine, by id, with a default per MCP session and an idle limit."""

    def __init__(
        self,
        engine: Engine,
        *,
        idle_timeout: float,
        max_workspaces: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.idle_timeout = idle_timeout
        self.max_workspaces = max_workspaces
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._defaults: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._lock = asyncio.Lock()

    async def resolve(self, workspace_id: str | None, session: object | None) -> Workspace:
        """The workspace ``workspace_id`` (created if new), or ``session``'s default one; without a session
        (``None``), the existing workspace ``workspace_id``.

        Raises:
            InvalidSpec: no session and no ``workspace_id``.
            WorkspaceNotFound: no session, and no workspace ``workspace_id``.
        """
        if session is None:
            return self._existing(workspace_id)
        if workspace_id is None:
            workspace_id = self._defaults.get(session)
            if workspace_id is None or workspace_id not in self._entries:
                workspace_id = f"mcp-{secrets.token_hex(6)}"
                self._defaults[session] = workspace_id
        return (await self.create(workspace_id))[0]

    def _existing(self, workspace_id: str | None) -> Workspace:
        if workspace_id is None:
            raise InvalidSpec(
                "workspace_id is required on this connection (MCP 2026-07-28 has no session): call workspace_create "
                "and pass the workspace_id it returns to every call on that workspace"
            )
        entry = self._entries.get(workspace_id)
        if entry is None:
            raise WorkspaceNotFound(
                f"no workspace {workspace_id!r} on this server (it was closed, idle too long, or never made): "
                "call workspace_create for a new one, or workspace_list for those there are"
            )
        entry.last_used = self._clock()
        return entry.ws

    async def create(self, workspace_id: str | None = None) -> tuple[Workspace, bool]:
        """The workspace ``workspace_id`` (a new id when ``None``) and whether it was created now.

        Raises:
            InvalidSpec: the id is not of the form ``WORKSPACE_ID_PATTERN`` allows.
            LimitExceeded: the server already has ``max_workspaces``.
        """
        workspace_id = workspace_id or f"mcp-{secrets.token_hex(6)}"
        if not WORKSPACE_ID_PATTERN.match(workspace_id):
            raise InvalidSpec(
                f"workspace_id {workspace_id!r} is not valid: use 1-3 parts joined by '/', each of letters, digits, "
                "'.', '_' or '-' (at most 64 characters, starting with a letter or digit)"
            )
        async with self._lock:
            entry = self._entries.get(workspace_id)
            if entry is not None:
                entry.last_used = self._clock()
                return entry.ws, False
            if len(self._entries) >= self.max_workspaces:
                raise LimitExceeded(
                    f"this server already has {self.max_workspaces} workspaces (the max_workspaces limit); close one "
                    "with workspace_close or reuse one by its workspace_id (workspace_list shows them)"
                )
            ws = await self.engine.manager.create_workspace(workspace_id)
            self._entries[workspace_id] = _Entry(ws, self._clock())
            return ws, True

    @contextlib.contextmanager
    def in_use(self, ws: Workspace) -> Iterator[None]:
        """Mark ``ws`` busy for the duration of a tool call: it is never reaped meanwhile."""
        entry = self._entries.get(ws.id)
        if entry is None:  # closed by another call meanwhile: nothing to keep alive
            yield
            return
        entry.calls += 1
        try:
            yield
        finally:
            entry.calls -= 1
            entry.last_used = self._clock()

    def listing(self) -> list[dict[str, Any]]:
        now = self._clock()
        return [
            {"workspace_id": wid, "idle_sec": round(now - e.last_used, 1)} for wid, e in sorted(self._entries.items())
        ]

    async def close(self, workspace_id: str) -> None:
        """Stop the workspace's programs and remove it with its files.

        Raises:
            WorkspaceNotFound: this server has no workspace of that id.
        """
        async with self._lock:
            entry = self._entries.pop(workspace_id, None)
        if entry is None:
            known = ", ".join(sorted(self._entries)) or "none"
            raise WorkspaceNotFound(f"no workspace {workspace_id!r} on this server (known: {known})")
        await self.engine.manager.cleanup(entry.ws)

    async def reap(self) -> list[str]:
        """Remove the workspaces idle past the limit; their ids."""
        now = self._clock()
        idle = [wid for wid, e in self._entries.items() if now - e.last_used > self.idle_timeout]
        removed = []
        for wid in idle:
            entry = self._entries.get(wid)
            if entry is None or entry.calls or now - entry.last_used <= self.idle_timeout:
                continue  # in use, or used again meanwhile
            if await self.engine.runner.list_programs(entry.ws):
                entry.last_used = now  # a background program is work in progress, not idleness
                continue
            with contextlib.suppress(WorkspaceNotFound):
                await self.close(wid)
                removed.append(wid)
        return removed

    async def reap_forever(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reap()
            except (ExecspaceError, OSError):  # one workspace that cannot go must not stop the reaping of others
                _log.warning("reaping idle workspaces failed; retrying in %gs", interval, exc_info=True)

    async def aclose(self) -> None:
        """Remove every workspace of this server."""
        async with self._lock:
            entries, self._entries = list(self._entries.values()), {}
        for entry in entries:
            await self.engine.manager.cleanup(entry.ws)
